import { readlinkSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import * as fc from 'fast-check';
import { createLocalProvider } from '../../providers/local';
import { readState, sandboxPaths } from '../../providers/sandbox-state';
import { FsCheckpointStore } from '../../stores/fs';
import { context, tempDir, uniqueId } from './helpers';

// A release writes two things that guard exactly-once: the sandbox's state (its raised fence) and the
// receipt. The receipt is synced while the state is saved, but takes its name only once the state is
// durable: a crash or a failed write never leaves a receipt for a release whose fence was not kept.

type Sync = (this: fs.FileHandle) => Promise<void>;

/** Runs `fn` with every FileHandle fsync recorded by path; `fail(path)` true makes that fsync fail instead. */
async function withSyncs<T>(fail: (file: string) => boolean, fn: () => Promise<T>): Promise<{ synced: string[] }> {
  const probe = await fs.open(__filename, 'r');
  const proto = Object.getPrototypeOf(probe) as { sync: Sync };
  await probe.close();
  const original = proto.sync;
  const synced: string[] = [];
  proto.sync = function (this: fs.FileHandle) {
    const file = readlinkSync(`/proc/self/fd/${this.fd}`);
    if (fail(file)) return Promise.reject(Object.assign(new Error(`injected: fsync ${file}`), { code: 'EIO' }));
    synced.push(file);
    return original.call(this);
  };
  try {
    await fn().catch(() => undefined);
  } finally {
    proto.sync = original;
  }
  return { synced };
}

const modes = ['DETACH', 'TERMINATE'] as const;

test('property: the receipt is named only after the raised fence is durable; a failed save leaves no receipt, and the retry releases', async () => {
  const dataDir = await tempDir('release-durability');
  const store = new FsCheckpointStore(path.join(dataDir, 'store'));
  const provider = createLocalProvider({ hostId: 'release-durability', dataDir, store, volumes: 'off' });
  try {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...modes),
        // Which write fails, if any: the state's temp file, the receipt's temp file, or none.
        fc.constantFrom('state.json.tmp-', 'receipts/', undefined),
        async (mode, failing) => {
          const sandboxId = uniqueId('rd');
          const paths = sandboxPaths(dataDir, sandboxId);
          const ctx = context({ ownerId: sandboxId, hostId: 'release-durability' });
          await provider.provision({ sandboxId, fence: 1, workspace: { kind: 'isolated' } }, ctx);
          await provider.start({ sandboxId, fence: 1 }, ctx);
          const request = { sandboxId, fence: 2, idempotencyKey: `${sandboxId}/2/release`, mode, reason: 'test' };
          const receiptsBefore = await fs.readdir(paths.receipts).catch(() => [] as string[]);
          let released: unknown;
          const { synced } = await withSyncs(
            (file) => failing !== undefined && file.includes(failing) && !file.endsWith('/receipts'),
            async () => (released = await provider.release(request, ctx)),
          );
          const receipts = await fs.readdir(paths.receipts).catch(() => [] as string[]);
          if (failing === undefined) {
            expect(released).toMatchObject({ fence: 2, mode, duplicate: false });
            // The state's temp file and its directory were synced before the receipts directory last was.
            const stateDirSync = synced.lastIndexOf(path.dirname(paths.stateFile));
            const receiptDirSync = synced.lastIndexOf(paths.receipts);
            expect(synced.some((f) => f.startsWith(`${paths.stateFile}.tmp-`))).toBe(true);
            expect({ stateDirSync: stateDirSync >= 0, receiptAfter: receiptDirSync > stateDirSync }).toEqual({
              stateDirSync: true,
              receiptAfter: true,
            });
            expect(receipts.length).toBe(receiptsBefore.length + 1);
          } else {
            expect(released).toBeUndefined();
            // No receipt and no temp file of one: the release did not happen as far as a retry can tell.
            expect(receipts).toEqual(receiptsBefore);
            const retried = await provider.release(request, ctx);
            expect(retried).toMatchObject({ fence: 2, mode, duplicate: false });
          }
          // Whatever failed, once a receipt exists the fence it stands for is on disk.
          expect((await readState(paths))?.maxFence).toBe(2);
          expect(await provider.release(request, ctx)).toMatchObject({ fence: 2, duplicate: true });
          await provider.destroy({ sandboxId, fence: 3 }, ctx);
        },
      ),
      { numRuns: 12 },
    );
  } finally {
    await provider.close();
  }
});
