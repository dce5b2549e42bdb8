import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { evictUnderPressure, orphanSweep, withLifecycleLock } from '../../providers/maintenance';
import { sandboxesDir, sandboxPaths } from '../../providers/sandbox-state';
import { context, tempDir } from './helpers';
import { makeHost, sh, type Host } from './harness';

// Host maintenance of dormant copies, on real sandboxes with an injected clock
// and injected free-space readings.

const HOUR = 3_600_000;

async function dormant(host: Host): Promise<string> {
  const id = await host.sandbox();
  await sh(host.provider, id, 'echo data > file');
  await host.provider.release(
    { sandboxId: id, idempotencyKey: `${id}/release`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
    context(),
  );
  return id;
}

const exists = (file: string) =>
  fs.access(file).then(
    () => true,
    () => false,
  );

describe('orphanSweep', () => {
  it('starts an on-disk clock for orphaned dormant copies and deletes them after the TTL, never live or running ones', async () => {
    const host = await makeHost();
    const hostPath = path.join(await tempDir('active'), 'ws');
    const orphan = await dormant(host);
    const live = await dormant(host);
    const running = await host.sandbox({ hostPath });
    const activeOrphan = await host.sandbox({ hostPath });
    await sh(host.provider, activeOrphan, 'echo host-file > keep.txt');
    await host.provider.release(
      { sandboxId: activeOrphan, idempotencyKey: 'k', mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    const dir = sandboxesDir(host.dataDir);
    const t0 = new Date('2030-01-01T00:00:00Z');
    const isLive = async (id: string) => id === live;
    const sweep = async (at: number, ttlSeconds = 3600) => {
      const report = await orphanSweep({
        sandboxesDir: dir,
        isLive,
        ttlSeconds,
        now: () => new Date(t0.getTime() + at),
      });
      return { marked: report.marked.sort(), deleted: report.deleted.sort(), waiting: report.waiting.sort() };
    };

    expect(await sweep(0)).toEqual({ marked: [orphan, activeOrphan].sort(), deleted: [], waiting: [] });
    expect(await exists(path.join(sandboxPaths(host.dataDir, orphan).meta, 'orphan-since.json'))).toBe(true);
    // Every sweep is a fresh call reading the clock from disk, as after a worker restart.
    expect(await sweep(HOUR / 2)).toEqual({ marked: [], deleted: [], waiting: [orphan, activeOrphan].sort() });
    expect(await sweep(HOUR / 2, 0)).toEqual({ marked: [], deleted: [], waiting: [orphan, activeOrphan].sort() });
    expect(await sweep(HOUR + 1)).toEqual({ marked: [], deleted: [orphan, activeOrphan].sort(), waiting: [] });

    expect(await exists(sandboxPaths(host.dataDir, orphan).root)).toBe(false);
    expect(await fs.readFile(path.join(hostPath, 'keep.txt'), 'utf8')).toBe('host-file\n');
    expect(await exists(sandboxPaths(host.dataDir, live).root)).toBe(true);
    expect(await exists(sandboxPaths(host.dataDir, running).root)).toBe(true);
  });

  it('re-checks under the lifecycle lock: a copy restored meanwhile, or live again, is kept', async () => {
    const host = await makeHost();
    const restored = await dormant(host);
    const revived = await dormant(host);
    const dir = sandboxesDir(host.dataDir);
    const t0 = Date.parse('2030-01-01T00:00:00Z');
    await orphanSweep({ sandboxesDir: dir, isLive: async () => false, ttlSeconds: 60, now: () => new Date(t0) });

    const calls = new Map<string, number>();
    const report = await orphanSweep({
      sandboxesDir: dir,
      ttlSeconds: 60,
      now: () => new Date(t0 + HOUR),
      isLive: async (id) => {
        const n = (calls.get(id) ?? 0) + 1;
        calls.set(id, n);
        if (id === restored && n === 1) {
          // The Run resumes on this host between the sweep's listing and its deletion.
          const state = JSON.parse(await fs.readFile(sandboxPaths(host.dataDir, id).stateFile, 'utf8'));
          await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: state.dormant.checkpoint }, context());
        }
        return id === revived && n > 1;
      },
    });
    expect(report.deleted).toEqual([]);
    expect(await sh(host.provider, restored, 'cat file', 3)).toBe('data\n');
    expect(await exists(sandboxPaths(host.dataDir, revived).root)).toBe(true);
  });

  it('a copy destroyed between the listing and its marking is skipped, and the sweep goes on with the others', async () => {
    // Found by the load test: Runs completing during a sweep made it fail with ENOENT, leaving the other copies unswept.
    const host = await makeHost();
    const destroyed = await dormant(host);
    const orphan = await dormant(host);
    const report = await orphanSweep({
      sandboxesDir: sandboxesDir(host.dataDir),
      ttlSeconds: 60,
      isLive: async (id) => {
        if (id === destroyed) await host.provider.destroy({ sandboxId: id, fence: 3 }, context());
        return false;
      },
    });
    expect(report.marked).toEqual([orphan]);
    expect(await exists(path.join(sandboxPaths(host.dataDir, orphan).meta, 'orphan-since.json'))).toBe(true);
  });

  it('withLifecycleLock runs holders of one sandbox one at a time, in order', async () => {
    const order: string[] = [];
    const hold = (name: string, ms: number) =>
      withLifecycleLock('sbx-lock', async () => {
        order.push(`${name}+`);
        await sleep(ms);
        order.push(`${name}-`);
      });
    await Promise.all([
      hold('a', 50),
      hold('b', 10),
      hold('c', 0),
      withLifecycleLock('other', async () => order.push('other')),
    ]);
    expect(order.filter((o) => o !== 'other')).toEqual(['a+', 'a-', 'b+', 'b-', 'c+', 'c-']);
    expect(order.indexOf('other')).toBeLessThan(order.indexOf('a-'));
  });
});

describe('evictUnderPressure', () => {
  it('evicts dormant copies with a checkpoint, oldest first, only until there is enough free space', async () => {
    const host = await makeHost();
    const oldest = await dormant(host);
    await sleep(5);
    const unverified = await dormant(host);
    await sleep(5);
    const middle = await dormant(host);
    await sleep(5);
    const newest = await dormant(host);
    const running = await host.sandbox();
    const dir = sandboxesDir(host.dataDir);
    const uriOf = async (id: string) =>
      JSON.parse(await fs.readFile(sandboxPaths(host.dataDir, id).stateFile, 'utf8')).dormant.checkpoint.uri as string;
    const gone = await uriOf(unverified);
    await host.store.delete(gone); // its checkpoint vanished from the store: the local copy is the only one left

    // Every evicted copy frees 1000 bytes in this simulated filesystem.
    const start = (await fs.readdir(dir)).length;
    const freeBytes = async () => 10_000 + (start - (await fs.readdir(dir)).length) * 1000;
    const result = await evictUnderPressure({
      sandboxesDir: dir,
      minFreeBytes: 11_500,
      freeBytes,
      checkpointExists: (uri) => host.store.exists(uri),
    });
    expect(result).toEqual({ evicted: [oldest, middle], freeBytes: 12_000 });
    for (const [id, kept] of [
      [oldest, false],
      [unverified, true],
      [middle, false],
      [newest, true],
      [running, true],
    ] as const) {
      expect(await exists(sandboxPaths(host.dataDir, id).root)).toBe(kept);
    }
    // Real statfs, no pressure: nothing is touched.
    expect((await evictUnderPressure({ sandboxesDir: dir, minFreeBytes: 0 })).evicted).toEqual([]);
    expect(await exists(sandboxPaths(host.dataDir, newest).root)).toBe(true);
  });
});
