import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, listTree, stasisError } from './helpers';
import { makeHost, sh } from './harness';

// Checkpoints at their edges: a release never terminates compute for a
// checkpoint restore would refuse.

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
