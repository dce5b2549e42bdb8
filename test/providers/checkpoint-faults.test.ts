import { execFileSync } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { StasisError } from '../../common/errors';
import { packSandbox, unpackCheckpoint } from '../../stores/archive';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, listTree, stasisError, tempDir } from './helpers';
import { makeHost, sh } from './harness';

// Checkpoints at their edges: a release never terminates compute for a
// checkpoint restore would refuse; a restore that fails on a full disk is
// retried and completes, also when it had half-filled a host path.

const snapshot = (sandboxId: string, fence: number) => ({
  sandboxId,
  idempotencyKey: `${sandboxId}/${fence}/release`,
  mode: 'SNAPSHOT_AND_TERMINATE' as const,
  fence,
  reason: 'test',
});

describe('a release checks its checkpoint the way restore will', () => {
  it('refuses a checkpoint past the restore limits: compute keeps running, no object, no receipt', async () => {
    const limits = { archiveLimits: { maxBytes: 1024 * 1024, maxEntries: 1000 } };
    const host = await makeHost(limits);
    const id = await host.sandbox();
    await sh(host.provider, id, 'head -c 2000000 /dev/urandom > big.bin; echo kept > note.txt');

    const err = await stasisError(host.provider.release(snapshot(id, 2), context()), 'CHECKPOINT_INVALID');
    expect(err.message).toMatch(/"workspace\/big\.bin" takes the unpacked size past the limit of 1048576 bytes/);
    expect(await host.provider.processCount(id)).toBe(1);
    expect(await sh(host.provider, id, 'cat note.txt', 2)).toBe('kept\n');
    const paths = sandboxPaths(host.dataDir, id);
    expect(await fs.readdir(paths.receipts)).toEqual([]);
    expect(await listTree(path.join(host.dataDir, 'store')).catch(() => [])).not.toContainEqual(
      expect.stringMatching(/\.tar\.gz$/),
    );

    // Within the limits, the same sandbox snapshots and restores on another host.
    await sh(host.provider, id, 'rm big.bin', 2);
    const receipt = await host.provider.release(snapshot(id, 3), context());
    expect(await host.provider.processCount(id)).toBe(0);
    const other = await makeHost({ ...limits, store: host.store });
    await other.provider.restore({ sandboxId: id, fence: 4, checkpoint: receipt.checkpoint! }, context());
    expect(await sh(other.provider, id, 'cat note.txt', 4)).toBe('kept\n');
  });
});

// A small tmpfs (the tests run as root) is a disk that really fills up.
const mounts: string[] = [];
async function smallDisk(sizeKiB: number): Promise<string> {
  const dir = await tempDir('small-disk');
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeKiB}k`, 'tmpfs', dir]);
  mounts.push(dir);
  return dir;
}
const grow = (dir: string, sizeKiB: number) => execFileSync('mount', ['-o', `remount,size=${sizeKiB}k`, dir]);
afterAll(() => {
  for (const dir of mounts) execFileSync('umount', ['-l', dir]);
});

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => {
      throw new Error('expected the call to fail');
    },
    (err: unknown) => err,
  );
}

describe('a restore that hits a full disk', () => {
  it('fails with ENOSPC (not CHECKPOINT_INVALID), leaves nothing, and a later restore restores everything', async () => {
    const source = await makeHost();
    const id = await source.sandbox();
    // One chunk for all nine copies: the download and its decompressed pack fit on the small disk, the
    // unpacked files do not (not zeros, which a restore leaves holes, nor a pack larger than the disk).
    await sh(
      source.provider,
      id,
      'head -c 300000 /dev/urandom > copy0.bin; for i in 1 2 3 4 5 6 7 8; do cp copy0.bin copy$i.bin; done; echo hi > small.txt',
    );
    const { checkpoint } = await source.provider.release(snapshot(id, 2), context());

    const disk = await smallDisk(1024);
    const target = await makeHost({ store: source.store, dataDir: disk });
    const err = await rejection(
      target.provider.restore({ sandboxId: id, fence: 3, checkpoint: checkpoint! }, context()),
    );
    expect(err).not.toBeInstanceOf(StasisError);
    expect((err as NodeJS.ErrnoException).code).toBe('ENOSPC');
    expect(await listTree(disk)).toEqual(['sandboxes']);

    grow(disk, 64 * 1024);
    await target.provider.restore({ sandboxId: id, fence: 3, checkpoint: checkpoint! }, context());
    expect(await sh(target.provider, id, 'cat copy*.bin | wc -c; cat small.txt', 3)).toBe('2700000\nhi\n');
    expect((await fs.readdir(sandboxPaths(disk, id).root)).sort()).toEqual(['meta', 'volume']);
    expect((await fs.readdir(sandboxPaths(disk, id).volume)).sort()).toEqual(['envs', 'home', 'workspace']);
  });

  it('fails with ENOSPC, not CHECKPOINT_INVALID, when a pack does not fit decompressed', async () => {
    const source = await makeHost();
    const id = await source.sandbox();
    // 3.7 MB of text that compresses to ~40 KB: the pack downloads onto the 1 MiB disk, zstd cannot unpack it there.
    await sh(
      source.provider,
      id,
      `awk 'BEGIN{for(i=0;i<40000;i++) printf "%08d the same long sentence on every line, so that it compresses well\\n", i}' > text.txt`,
    );
    const { checkpoint } = await source.provider.release(snapshot(id, 2), context());
    const disk = await smallDisk(1024);
    const target = await makeHost({ store: source.store, dataDir: disk });
    const err = await rejection(
      target.provider.restore({ sandboxId: id, fence: 3, checkpoint: checkpoint! }, context()),
    );
    expect({ code: (err as NodeJS.ErrnoException).code, message: (err as Error).message }).toEqual({
      code: 'ENOSPC',
      message: expect.stringMatching(/no space left to unpack pack .* of checkpoint/),
    });
    expect(err).not.toBeInstanceOf(StasisError);
    expect(await listTree(disk)).toEqual(['sandboxes']);
    grow(disk, 64 * 1024);
    await target.provider.restore({ sandboxId: id, fence: 3, checkpoint: checkpoint! }, context());
    expect(await sh(target.provider, id, 'wc -l < text.txt', 3)).toBe('40000\n');
  });

  it('never passes for done while a file entry is still being written (more entries follow it)', async () => {
    const root = await tempDir('pack-full');
    await fs.mkdir(path.join(root, 'workspace'));
    // Not zeros, which a restore leaves holes.
    await fs.writeFile(path.join(root, 'workspace', 'big.bin'), Buffer.alloc(3_000_000, 1));
    await fs.mkdir(path.join(root, 'home', 'later'), { recursive: true });
    const archive = path.join(await tempDir('pack-full-archive'), 'c.tar.gz');
    await pipeline(packSandbox(root, ['workspace', 'home']), createWriteStream(archive));
    const disk = await smallDisk(1024);
    const err = await rejection(unpackCheckpoint(archive, disk));
    expect((err as NodeJS.ErrnoException).code).toBe('ENOSPC');
  });

  it('an active workspace filled half-way is filled again on the retry, not skipped', async () => {
    const source = await makeHost();
    const id = await source.sandbox({ hostPath: await tempDir('host-path') });
    await sh(
      source.provider,
      id,
      'for i in 1 2 3 4 5 6; do head -c 300000 /dev/urandom > part$i.bin; done; sha256sum part*.bin > sums',
    );
    const sums = await sh(source.provider, id, 'cat sums');
    const { checkpoint } = await source.provider.release(snapshot(id, 2), context());

    // Another host, whose host path sits on a disk that holds only half the workspace.
    const disk = await smallDisk(1024);
    const hostPath = path.join(disk, 'ws');
    const target = await makeHost({ store: source.store });
    const restore = () =>
      target.provider.restore(
        { sandboxId: id, fence: 3, checkpoint: checkpoint!, workspace: { kind: 'active', hostPath } },
        context(),
      );
    const err = await rejection(restore());
    expect((err as NodeJS.ErrnoException).code).toBe('ENOSPC');

    grow(disk, 64 * 1024);
    await restore();
    expect(await sh(target.provider, id, 'cat sums; sha256sum part*.bin', 3)).toBe(`${sums}${sums}`);
    // Nothing of the interrupted fill is left beside the host path.
    expect(await fs.readdir(disk)).toEqual(['ws']);
  });
});
