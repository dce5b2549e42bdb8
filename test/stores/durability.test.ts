import { execFileSync } from 'node:child_process';
import { readlinkSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { JobJournal } from '../../providers/jobs';
import { ReceiptStore } from '../../providers/receipts';
import { writeFileAtomic } from '../../stores/atomic-file';
import { FsCheckpointStore } from '../../stores/fs';
import { tempDir } from '../providers/helpers';

// What guards exactly-once survives a crash: receipts, the job journal and
// fs-store objects are written to a temp file, fsynced, renamed, and their
// directory fsynced. A failed write leaves no temp file behind.

/** Every fsync this process makes, by the path of what was synced (read from /proc/self/fd at the time). */
async function recordSyncs<T>(fn: () => Promise<T>): Promise<string[]> {
  const probe = await fs.open(__filename, 'r');
  const proto = Object.getPrototypeOf(probe) as { sync: (this: fs.FileHandle) => Promise<void> };
  await probe.close();
  const original = proto.sync;
  const synced: string[] = [];
  proto.sync = function (this: fs.FileHandle) {
    synced.push(readlinkSync(`/proc/self/fd/${this.fd}`));
    return original.call(this);
  };
  try {
    await fn();
  } finally {
    proto.sync = original;
  }
  return synced;
}

/** The file was synced under a temp name beside it, then its directory. */
function expectDurable(synced: string[], file: string): void {
  const dir = path.dirname(file);
  const fileSync = synced.findIndex(
    (p) => path.dirname(p) === dir && path.basename(p).startsWith(`${path.basename(file)}.`),
  );
  const dirSync = synced.lastIndexOf(dir);
  expect({ file, fileSynced: fileSync >= 0, dirSyncedAfter: dirSync > fileSync }).toEqual({
    file,
    fileSynced: true,
    dirSyncedAfter: true,
  });
}

const request = {
  sandboxId: 'sbx-1',
  idempotencyKey: 'run/1/release',
  mode: 'TERMINATE' as const,
  fence: 2,
  reason: 'test',
};
const job = { sandboxId: 'sbx-1', fence: 1, jobId: 'job-1', command: 'true' };

describe('durable writes', () => {
  it('receipts, job journal entries and fs-store objects are fsynced, and so is their directory', async () => {
    const dir = await tempDir('durable');
    const receipts = new ReceiptStore(path.join(dir, 'receipts'));
    const receipt = {
      sandboxId: 'sbx-1',
      idempotencyKey: request.idempotencyKey,
      mode: 'TERMINATE' as const,
      computeReleased: true,
      duplicate: false,
      fence: 2,
      releasedAt: new Date().toISOString(),
    };
    const receiptSyncs = await recordSyncs(() => receipts.save(request, receipt));
    const [receiptFile] = await fs.readdir(path.join(dir, 'receipts'));
    expectDurable(receiptSyncs, path.join(dir, 'receipts', receiptFile));

    const journal = new JobJournal(path.join(dir, 'jobs'));
    const journalSyncs = await recordSyncs(async () => {
      await journal.begin(job);
      await journal.finish(job, { outcome: { exitCode: 0, stdout: '', stderr: '' } });
    });
    const [jobFile] = (await fs.readdir(path.join(dir, 'jobs'))).filter((n) => n.endsWith('.json'));
    expectDurable(journalSyncs, path.join(dir, 'jobs', jobFile));

    const store = new FsCheckpointStore(path.join(dir, 'store'));
    const storeSyncs = await recordSyncs(() =>
      store.put('checkpoints/sbx-1/2-a.tar.gz', Readable.from([Buffer.from('bytes')]), { run: 'r' }),
    );
    const object = path.join(dir, 'store', 'checkpoints', 'sbx-1', '2-a.tar.gz');
    expectDurable(storeSyncs, object);
    expectDurable(storeSyncs, `${object}.labels.json`);
    // The directories the put created are durable too.
    expect(storeSyncs).toEqual(expect.arrayContaining([path.join(dir, 'store', 'checkpoints')]));
  });

  describe('on a full disk', () => {
    let disk: string;
    beforeAll(async () => {
      disk = await tempDir('full-disk');
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=256k', 'tmpfs', disk]);
    });
    afterAll(() => execFileSync('umount', ['-l', disk]));

    it('a failed write leaves no temp file behind and the old content in place', async () => {
      const file = path.join(disk, 'state.json');
      await writeFileAtomic(file, 'old');
      await expect(writeFileAtomic(file, Buffer.alloc(1024 * 1024, 1))).rejects.toMatchObject({ code: 'ENOSPC' });
      expect(await fs.readdir(disk)).toEqual(['state.json']);
      expect(await fs.readFile(file, 'utf8')).toBe('old');

      const journal = new JobJournal(path.join(disk, 'jobs'));
      await journal.begin(job);
      const big = { exitCode: 0, stdout: 'x'.repeat(1024 * 1024), stderr: '' };
      await expect(journal.finish(job, { outcome: big })).rejects.toMatchObject({ code: 'ENOSPC' });
      expect((await fs.readdir(path.join(disk, 'jobs'))).filter((n) => n !== '.pruned')).toHaveLength(1);
      await expect(journal.lookup(job)).rejects.toMatchObject({ code: 'JOB_INTERRUPTED' });

      const store = new FsCheckpointStore(path.join(disk, 'store'));
      await expect(
        store.put('checkpoints/sbx-1/3-b.tar.gz', Readable.from([Buffer.alloc(1024 * 1024, 2)]), {}),
      ).rejects.toMatchObject({ code: 'ENOSPC' });
      expect(await fs.readdir(path.join(disk, 'store', 'checkpoints', 'sbx-1'))).toEqual([]);
    });
  });
});
