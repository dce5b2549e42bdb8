import fc from 'fast-check';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { CheckpointStore } from '../../stores/api';
import { chunkHash } from '../../stores/cas/hasher';
import { FsCheckpointStore } from '../../stores/fs';
import { Slab, Slabs } from '../../stores/cas/slabs';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// The read buffers a checkpoint reuses (slabs.ts): a buffer goes back to its pool only once nothing
// holds its bytes, so a checkpoint whose reads reuse buffers over and over still stores every byte
// it read. A buffer reused too early would overwrite chunks a pack still waits to copy out.

const store = s3StoreFromEnv(5 * 1024 * 1024);

describe('slabs', () => {
  test('a buffer is never handed out while a hold on it is outstanding; holds cannot be over-released', () => {
    type Op = { kind: 'take' } | { kind: 'hold' | 'release'; which: number };
    const op: fc.Arbitrary<Op> = fc.oneof(
      fc.constant({ kind: 'take' as const }),
      fc.record({ kind: fc.constantFrom('hold' as const, 'release' as const), which: fc.nat() }),
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 200 }), fc.integer({ min: 0, max: 3 }), (ops, keep) => {
        const pool = new Slabs(16, keep);
        const live: { slab: Slab; holds: number }[] = [];
        for (const o of ops) {
          if (o.kind === 'take') {
            const slab = pool.take();
            expect(slab.buffer.length).toBe(16);
            // Never the memory of a slab somebody still holds.
            for (const other of live)
              if (other.holds > 0) expect(other.slab.buffer.buffer).not.toBe(slab.buffer.buffer);
            live.push({ slab, holds: 1 });
            continue;
          }
          if (live.length === 0) continue;
          const target = live[o.which % live.length];
          if (o.kind === 'hold') {
            if (target.holds === 0) expect(() => target.slab.hold()).toThrow('held again');
            else {
              target.slab.hold();
              target.holds += 1;
            }
          } else if (target.holds === 0) expect(() => target.slab.release()).toThrow('released more often');
          else {
            target.slab.release();
            target.holds -= 1;
          }
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe.each([
  ['s3', async (): Promise<CheckpointStore> => store],
  ['fs', async (): Promise<CheckpointStore> => new FsCheckpointStore(await tempDir('cas-given-sha'))],
])("putBytes with the caller's sha-256 (%s)", (_kind, makeStore) => {
  test('stores the bytes under that hash when it is theirs; refuses the put, storing nothing, when it is not', async () => {
    const store = await makeStore();
    const prefix = `checkpoints/${uniqueId('cas-given-sha')}/`;
    try {
      await fc.assert(
        fc.asyncProperty(fc.uint8Array({ minLength: 1, maxLength: 300_000 }), fc.nat(), async (array, flip) => {
          const bytes = Buffer.from(array);
          const key = `${prefix}${uniqueId('o')}`;
          const right = chunkHash(bytes);
          // One hex digit of the hash changed: a hash of other bytes.
          const at = flip % 64;
          const wrong = `${right.slice(0, at)}${right[at] === '0' ? '1' : '0'}${right.slice(at + 1)}`;
          await expect(store.putBytes(key, bytes, {}, undefined, wrong)).rejects.toThrow();
          expect(await store.list(prefix)).toEqual([]);
          await expect(store.putBytes(key, bytes, {}, undefined, 'not a hash')).rejects.toThrow();
          const stored = await store.putBytes(key, bytes, {}, undefined, right);
          expect(stored).toEqual({ uri: store.uriOf(key), sha256: right, bytes: bytes.length });
          expect(await store.read(stored.uri, bytes.length)).toEqual(bytes);
          await store.deletePrefix(prefix);
        }),
        { numRuns: 10 },
      );
    } finally {
      await store.deletePrefix(prefix);
    }
  });
});

/** `size` bytes of runs of random bytes and of text, each run of a random length. */
function mixedBytes(size: number, seed: number[]): Buffer {
  const parts: Buffer[] = [];
  let total = 0;
  for (let i = 0; total < size; i += 1) {
    const length = Math.min(size - total, 64 * 1024 + ((seed[i % seed.length] * 7919) % (3 * 1024 * 1024)));
    parts.push(
      seed[i % seed.length] % 2 === 0
        ? randomBytes(length)
        : Buffer.from(`const value${i} = ${seed[i % seed.length]};\n`.repeat(Math.ceil(length / 20))).subarray(
            0,
            length,
          ),
    );
    total += length;
  }
  return Buffer.concat(parts);
}

describe('a checkpoint reusing its read buffers', () => {
  test('restores byte for byte: large files mixing random and text runs, copies of them, and small files over several batches', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: 2, max: 18 }), { minLength: 4, maxLength: 7 }),
        fc.array(fc.nat(1000), { minLength: 3, maxLength: 12 }),
        async (largeMiB, seed) => {
          const root = await newSandboxRoot();
          const workspace = path.join(root, 'workspace');
          // Large files (many read pieces, so buffers come back and go out again), each cut into chunks that
          // go to the raw packs and to the compressed ones, which stay open across many pieces.
          for (const [i, mib] of largeMiB.entries()) {
            const data = mixedBytes(mib * 1024 * 1024 + i * 4099, seed.slice(i % seed.length).concat(seed));
            await fs.writeFile(path.join(workspace, `large-${i}.bin`), data);
            // A copy: its chunks are already in a pack, so nothing more holds its buffers.
            if (i === 1) await fs.writeFile(path.join(workspace, `large-${i}-copy.bin`), data);
          }
          // Small files over several batches of 4 MiB: text, and random ones large enough for the raw packs.
          await fs.mkdir(path.join(root, 'home', 'src'));
          for (let i = 0; i < 900; i += 1) {
            const file = path.join(root, 'home', 'src', `f${i}.ts`);
            if (i % 60 === 0) await fs.writeFile(file, randomBytes(100_000 + seed[i % seed.length] * 300));
            else await fs.writeFile(file, `export const f${i} = ${seed[i % seed.length]};\n`.repeat(1 + (i % 400)));
          }
          const before = await describeTree(root);
          const sandboxId = uniqueId('cas-slabs');
          try {
            const taken = await take(store, root, sandboxId);
            expect(taken.stats.rawPacks).toBeGreaterThan(0);
            expect(taken.stats.packs).toBeGreaterThan(taken.stats.rawPacks);
            const restored = await restoreFresh(store, taken.checkpoint);
            expect(await describeTree(restored.target)).toEqual(before);
            await fs.rm(restored.target, { recursive: true, force: true });
          } finally {
            await store.deletePrefix(`checkpoints/${sandboxId}/`);
            await fs.rm(root, { recursive: true, force: true });
          }
        },
      ),
      { numRuns: 3 },
    );
  }, 300_000);
});

describe('a checkpoint holding read buffers for its open packs', () => {
  // Hostile layout: every 4 MiB batch of small files is mostly random files (raw packs, sealed soon)
  // and one tiny text file, whose chunk waits in the compressed pack until 8 MiB of such files came.
  // Were that pack to keep each batch it took a chunk from, the worker would hold the whole workspace.
  test('memory stays bounded however few bytes of each buffer a pack keeps; the restore is byte for byte', async () => {
    const root = await newSandboxRoot();
    const src = path.join(root, 'home', 'src');
    await fs.mkdir(src);
    const groups = 64; // 4 random files of ~1 MB and a tiny one each: ~256 MB of files, ~64 batches
    for (let g = 0; g < groups; g += 1) {
      const name = `g${String(g).padStart(3, '0')}`;
      for (const letter of ['a', 'b', 'c', 'd'])
        await fs.writeFile(path.join(src, `${name}-${letter}.bin`), randomBytes(1_000_000));
      await fs.writeFile(path.join(src, `${name}-e.txt`), `export const ${name} = ${g};\n`);
    }
    const before = await describeTree(root);
    const sandboxId = uniqueId('cas-slab-memory');
    const start = process.memoryUsage().arrayBuffers;
    let peak = 0;
    const sampler = setInterval(() => {
      peak = Math.max(peak, process.memoryUsage().arrayBuffers - start);
    }, 5);
    try {
      const taken = await take(store, root, sandboxId);
      clearInterval(sampler);
      expect(taken.stats.rawPacks).toBeGreaterThan(0);
      // ~64 batches of 4 MiB were read; a bound of a few batches, a few raw frames, and the garbage between collections.
      expect(peak).toBeLessThan(160 * 1024 * 1024);
      const restored = await restoreFresh(store, taken.checkpoint);
      expect(await describeTree(restored.target)).toEqual(before);
      await fs.rm(restored.target, { recursive: true, force: true });
    } finally {
      clearInterval(sampler);
      await store.deletePrefix(`checkpoints/${sandboxId}/`);
      await fs.rm(root, { recursive: true, force: true });
    }
  }, 300_000);
});
