import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { MANIFEST_SUFFIX, PACKS_DIR } from '../../stores/cas/manifest';
import { takeCheckpoint } from '../../stores/cas/upload';
import type { Checkpoint } from '../../common/schemas';
import type { CheckpointStore } from '../../stores/api';
import type { FaultProxy } from '../faults/s3-proxy';
import { s3StoreFromEnv, uniqueId } from '../providers/helpers';
import { behindProxy, describeTree, NAMES, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// Faults inside a first checkpoint whose read buffers and raw packs' frames are reused (slabs.ts):
// the store cuts, fails or outlives a pack's PutObject while the walk goes on reusing buffers. Each
// checkpoint that completes is restored from the store as another host reaches it (not through the
// proxy) and compared byte for byte; one that fails leaves no top object.

/** The test MinIO, reached directly: a restore on another host. */
const direct = s3StoreFromEnv();

/**
 * A workspace of many raw packs and compressed ones: large files of random and text runs (many read
 * pieces), a copy of one (its chunks already packed from other buffers), and small files over several
 * batches, the same small file in two batches among them.
 */
async function mixedWorkspace(root: string, large = 12): Promise<void> {
  for (let i = 0; i < large; i += 1) {
    const parts: Buffer[] = [];
    for (let run = 0; run < 6; run += 1)
      parts.push(
        run % 2 === 0
          ? randomBytes(2 * 1024 * 1024 + run * 70_001)
          : Buffer.from(`line ${i}.${run}\n`.repeat(60_000 + run * 1_000)),
      );
    const data = Buffer.concat(parts);
    await fs.writeFile(path.join(root, 'workspace', `large-${i}.bin`), data);
    if (i === 1) await fs.writeFile(path.join(root, 'workspace', 'large-1-copy.bin'), data);
  }
  await fs.mkdir(path.join(root, 'home', 'src'));
  const shared = randomBytes(300_000);
  for (let i = 0; i < 400; i += 1) {
    const file = path.join(root, 'home', 'src', `f${String(i).padStart(3, '0')}`);
    if (i === 10 || i === 390) await fs.writeFile(file, shared);
    else if (i % 7 === 0) await fs.writeFile(file, randomBytes(150_000 + i * 101));
    else await fs.writeFile(file, `export const f${i} = ${i};\n`.repeat(1 + i * 3));
  }
}

const isPackPut = ({ method, path: p }: { method: string; path: string }) =>
  method === 'PUT' && p.includes(`/${PACKS_DIR}`);

/**
 * Runs `fn` on a fresh sandbox root holding `mixedWorkspace`, with a fault proxy in front of the test MinIO
 * and the store reached through it; removes the root and the sandbox's objects after.
 */
async function withMixedSandbox(
  name: string,
  fn: (proxy: FaultProxy, store: CheckpointStore, root: string, sandboxId: string) => Promise<void>,
): Promise<void> {
  await behindProxy(async (proxy, store) => {
    const root = await newSandboxRoot();
    const sandboxId = uniqueId(name);
    try {
      await mixedWorkspace(root);
      await fn(proxy, store, root, sandboxId);
    } finally {
      await direct.deletePrefix(`checkpoints/${sandboxId}/`);
      await fs.rm(root, { recursive: true, force: true });
    }
  });
}

/** Restores `checkpoint` from the store on a fresh root (another host) and expects the tree `before`. */
async function expectRestoresAs(checkpoint: Checkpoint, before: Record<string, string>): Promise<void> {
  const restored = await restoreFresh(direct, checkpoint);
  expect(await describeTree(restored.target)).toEqual(before);
  await fs.rm(restored.target, { recursive: true, force: true });
}

async function topObjects(sandboxId: string): Promise<string[]> {
  const listed = await direct.list(`checkpoints/${sandboxId}/`);
  return listed.map((o) => o.key).filter((key) => key.endsWith(MANIFEST_SUFFIX));
}

describe('faults inside a first checkpoint reusing its buffers', () => {
  test("every pack's first PutObject is cut part-way: the SDK's retry sends the same bytes, the checkpoint restores byte for byte", async () => {
    await withMixedSandbox('slab-retry', async (proxy, store, root, sandboxId) => {
      const before = await describeTree(root);
      const cut = new Set<string>();
      proxy.hold = (request) =>
        isPackPut(request) && !cut.has(request.path)
          ? { afterBytes: Math.floor(request.contentLength / 2), onHeld: () => cut.add(request.path), reset: true }
          : undefined;
      const taken = await take(store, root, sandboxId);
      // More raw packs than frames are ever in flight (UPLOADS_IN_FLIGHT + 1): frames were reused meanwhile.
      expect(taken.stats.rawPacks).toBeGreaterThan(6);
      // Each pack was cut once and then stored whole by the retry.
      expect(cut.size).toBe(taken.stats.packs);
      await expectRestoresAs(taken.checkpoint, before);
    });
  }, 300_000);

  test('a raw pack whose every attempt fails after the walk reused its buffers: no top object; a retry on the same worker restores byte for byte', async () => {
    await withMixedSandbox('slab-fail', async (proxy, store, root, sandboxId) => {
      const before = await describeTree(root);
      // The third pack put (the walk has gone on reading into reused buffers meanwhile) never gets through.
      const seen: string[] = [];
      proxy.hold = (request) => {
        if (!isPackPut(request)) return undefined;
        if (!seen.includes(request.path)) seen.push(request.path);
        return seen.indexOf(request.path) === 2
          ? { afterBytes: Math.floor(request.contentLength / 3), onHeld: () => undefined, reset: true }
          : undefined;
      };
      await expect(take(store, root, sandboxId)).rejects.toThrow();
      expect(await topObjects(sandboxId)).toEqual([]);
      proxy.hold = undefined;
      const taken = await take(store, root, sandboxId);
      expect(await topObjects(sandboxId)).toHaveLength(1);
      await expectRestoresAs(taken.checkpoint, before);
    });
  }, 300_000);

  test('a release cancelled while a pack is on the wire: it rejects, no top object, and nothing is sent after it returned', async () => {
    await withMixedSandbox('slab-cancel', async (proxy, store, root, sandboxId) => {
      const controller = new AbortController();
      let packPuts = 0;
      // The second pack put stalls part-way through its body; the release is cancelled then.
      proxy.hold = (request) =>
        isPackPut(request) && (packPuts += 1) === 2
          ? {
              afterBytes: Math.floor(request.contentLength / 2),
              onHeld: () => controller.abort(new Error('cancelled')),
            }
          : undefined;
      await expect(
        takeCheckpoint({
          store,
          rootDir: root,
          names: NAMES,
          prefix: `checkpoints/${sandboxId}/`,
          name: uniqueId('t'),
          labels: {},
          limits: DEFAULT_ARCHIVE_LIMITS,
          progress: { bytes: 0 },
          signal: controller.signal,
        }),
      ).rejects.toThrow();
      expect(controller.signal.aborted).toBe(true);
      const sent = proxy.requests.length;
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      expect(proxy.requests.slice(sent)).toEqual([]);
      expect(await topObjects(sandboxId)).toEqual([]);
    });
  }, 300_000);

  test('two sandboxes released at once in one process (one hashing thread) each restore byte for byte', async () => {
    const roots = [await newSandboxRoot(), await newSandboxRoot()];
    const ids = [uniqueId('slab-twin'), uniqueId('slab-twin')];
    try {
      for (const root of roots) await mixedWorkspace(root, 3);
      const before = await Promise.all(roots.map((root) => describeTree(root)));
      const taken = await Promise.all(roots.map((root, i) => take(direct, root, ids[i])));
      for (const [i, { checkpoint }] of taken.entries()) await expectRestoresAs(checkpoint, before[i]);
    } finally {
      for (const id of ids) await direct.deletePrefix(`checkpoints/${id}/`);
      for (const root of roots) await fs.rm(root, { recursive: true, force: true });
    }
  }, 300_000);
});
