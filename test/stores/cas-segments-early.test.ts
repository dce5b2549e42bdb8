import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import type { CheckpointStore } from '../../stores/api';
import { MANIFEST_SUFFIX, PACK_SUFFIX, SEGMENT_SUFFIX, splitManifest } from '../../stores/cas/manifest';
import { passThrough } from '../helpers/store-wrap';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// A checkpoint stores its manifest's segments while its walk goes on (each once its entries' chunks
// are in sealed packs), against a real MinIO: the top object still comes last, after every pack and
// segment is stored; the segments are exactly those the whole manifest splits into; a segment put
// that fails mid-walk fails the checkpoint with nothing left writing, and a retry restores.

const store = s3StoreFromEnv();

type Kind = 'pack' | 'segment' | 'top';
const kindOf = (key: string): Kind =>
  key.endsWith(PACK_SUFFIX) ? 'pack' : key.endsWith(SEGMENT_SUFFIX) ? 'segment' : 'top';

/** The real store, watched: each put's start and end in order, those still in flight; puts of a kind delayed, one failing. */
function watchedStore(options: { delays: Record<Kind, number[]>; failSegment?: number; failPack?: number }) {
  const events: { kind: Kind; at: 'start' | 'end'; key: string }[] = [];
  let inFlight = 0;
  const counts: Record<Kind, number> = { pack: 0, segment: 0, top: 0 };
  const wrapped: CheckpointStore = {
    ...passThrough(store),
    async putBytes(key, body, labels, signal) {
      const kind = kindOf(key);
      const n = counts[kind]++;
      inFlight += 1;
      events.push({ kind, at: 'start', key });
      try {
        const wait = options.delays[kind];
        await delay(wait[n % wait.length]);
        if (kind === 'pack' && n === options.failPack) throw new Error(`injected failure of pack put ${n}`);
        if (kind === 'segment' && n === options.failSegment) {
          // A fault inside the put: its request is cancelled in flight (or, if it won the race, its answer is lost).
          const cut = new AbortController();
          const putting = store.putBytes(key, body, labels, cut.signal).catch(() => undefined);
          setImmediate(() => cut.abort(new Error('cut')));
          await putting;
          throw new Error(`injected failure of segment put ${n}`);
        }
        return await store.putBytes(key, body, labels, signal);
      } finally {
        inFlight -= 1;
        events.push({ kind, at: 'end', key });
      }
    },
  };
  return { store: wrapped, events, inFlight: () => inFlight };
}

/** Small text-like files (some the same), large random files between them, links: packs sealed all along the walk. */
async function mixedTree(shape: { small: number[]; large: number[]; dup: number }) {
  const root = await newSandboxRoot();
  const dir = path.join(root, 'workspace', 'src');
  await fs.mkdir(dir);
  const text = Buffer.from('export const value = 42; // some text that zstd shrinks\n'.repeat(200));
  for (const [i, size] of shape.small.entries()) {
    const body = i % 7 === shape.dup % 7 ? text.subarray(0, size) : Buffer.concat([Buffer.from(`${i}\n`), bytes(size)]);
    await fs.writeFile(path.join(dir, `f${String(i).padStart(5, '0')}.txt`), body);
    if (i % 50 === 0) await fs.symlink(`f${i}.txt`, path.join(dir, `l${String(i).padStart(5, '0')}`));
  }
  for (const [i, size] of shape.large.entries()) {
    await fs.writeFile(path.join(dir, `f${String(i * 97).padStart(5, '0')}.large`), bytes(size));
  }
  await fs.link(path.join(dir, 'f00000.txt'), path.join(root, 'home', 'hard'));
  return root;
}

/** A first checkpoint of `root` into `checkpoints/<sandboxId>/`, its packs compressed in `temp`. */
function takeInto(watched: CheckpointStore, root: string, sandboxId: string, temp: string) {
  return take(watched, root, sandboxId, undefined, path.join(temp, uniqueId('pack')));
}

/** What a failed take leaves: nothing still writing, no top object stored, no temporary file. */
async function expectNothingLeft(watched: ReturnType<typeof watchedStore>, prefix: string, temp: string) {
  expect(watched.inFlight()).toBe(0);
  expect(watched.events.some((e) => e.kind === 'top')).toBe(false);
  expect((await store.list(prefix)).filter((o) => o.key.endsWith(MANIFEST_SUFFIX))).toEqual([]);
  expect(await fs.readdir(temp)).toEqual([]);
}

/** A retry of a failed take, restored from the store: the tree as it was (`before`). Returns the retry. */
async function retryRestores(root: string, sandboxId: string, temp: string, before: unknown) {
  const retried = await takeInto(store, root, sandboxId, temp);
  const restored = await restoreFresh(store, retried.checkpoint);
  expect(await describeTree(restored.target)).toEqual(before);
  await fs.rm(restored.target, { recursive: true, force: true });
  return retried;
}

describe('segments stored during the walk', () => {
  test('the top object comes after every pack and segment; the segments are the whole manifest split; it restores byte for byte', async () => {
    const temp = await tempDir('cas-early');
    const shape = fc.record({
      small: fc.array(fc.nat(6000), { minLength: 1500, maxLength: 3000 }),
      large: fc.array(fc.integer({ min: 1, max: 3_000_000 }), { maxLength: 4 }),
      dup: fc.nat(6),
    });
    const delays = fc.array(fc.nat(30), { minLength: 1, maxLength: 5 });
    await fc.assert(
      fc.asyncProperty(shape, delays, delays, async (tree, packDelays, segmentDelays) => {
        const root = await mixedTree(tree);
        const sandboxId = uniqueId('cas-early');
        const prefix = `checkpoints/${sandboxId}/`;
        const watched = watchedStore({ delays: { pack: packDelays, segment: segmentDelays, top: [0] } });
        try {
          const taken = await takeInto(watched.store, root, sandboxId, temp);
          const { events } = watched;
          const topStart = events.findIndex((e) => e.kind === 'top' && e.at === 'start');
          // Every other put ended before the top object's began, and none came after it.
          expect(events.slice(topStart + 1)).toEqual([{ kind: 'top', at: 'end', key: events[topStart].key }]);
          expect(events.slice(0, topStart).filter((e) => e.at === 'start').length).toBe(topStart / 2);
          const manifest = taken.baseline.manifest;
          const whole = splitManifest(manifest).segments.map(({ ref }) => [ref[0], ref[2], ref[3]]);
          expect(manifest.segments!.map((ref) => [ref[0], ref[2], ref[3]])).toEqual(whole);
          // Each segment was put once, under its name.
          const segmentKeys = events.filter((e) => e.kind === 'segment' && e.at === 'start').map((e) => e.key);
          expect(new Set(segmentKeys).size).toBe(segmentKeys.length);
          expect(new Set(manifest.segments!.map(([name]) => `${prefix}segments/${name}${SEGMENT_SUFFIX}`))).toEqual(
            new Set(segmentKeys),
          );
          const restored = await restoreFresh(store, taken.checkpoint);
          expect(await describeTree(restored.target)).toEqual(await describeTree(root));
          await fs.rm(restored.target, { recursive: true, force: true });
        } finally {
          await store.deletePrefix(prefix);
          await fs.rm(root, { recursive: true, force: true });
        }
      }),
      { numRuns: 5 },
    );
    expect(await fs.readdir(temp)).toEqual([]);
  }, 240_000);

  test('segments are put before the walk is over: the first goes out before the last pack does', async () => {
    // ~30 MB of small compressible files: the first packs are sealed (and their segments complete) long before the walk ends.
    const root = await mixedTree({ small: new Array<number>(6000).fill(5000), large: [], dup: 0 });
    const temp = await tempDir('cas-early-order');
    const sandboxId = uniqueId('cas-early');
    const prefix = `checkpoints/${sandboxId}/`;
    const watched = watchedStore({ delays: { pack: [0], segment: [0], top: [0] } });
    try {
      await takeInto(watched.store, root, sandboxId, temp);
      const starts = watched.events.filter((e) => e.at === 'start');
      const firstSegment = starts.findIndex((e) => e.kind === 'segment');
      const lastPack = starts.map((e) => e.kind).lastIndexOf('pack');
      expect(starts.filter((e) => e.kind === 'pack').length).toBeGreaterThan(2);
      expect(firstSegment).toBeGreaterThanOrEqual(0);
      expect(firstSegment).toBeLessThan(lastPack);
    } finally {
      await store.deletePrefix(prefix);
      await fs.rm(root, { recursive: true, force: true });
    }
  }, 120_000);

  test('a segment put failing while the walk goes on fails the checkpoint with nothing still writing and no top object; a retry restores', async () => {
    const root = await mixedTree({ small: new Array<number>(4000).fill(3000), large: [2_500_000], dup: 3 });
    const before = await describeTree(root);
    const temp = await tempDir('cas-early-fail');
    for (const failSegment of [0, 2, 5]) {
      const sandboxId = uniqueId('cas-early-fail');
      const prefix = `checkpoints/${sandboxId}/`;
      try {
        const watched = watchedStore({ delays: { pack: [5, 0], segment: [0, 10], top: [0] }, failSegment });
        await expect(takeInto(watched.store, root, sandboxId, temp)).rejects.toThrow(
          `injected failure of segment put ${failSegment}`,
        );
        await expectNothingLeft(watched, prefix, temp);
        await retryRestores(root, sandboxId, temp, before);
      } finally {
        await store.deletePrefix(prefix);
      }
    }
    await fs.rm(root, { recursive: true, force: true });
  }, 180_000);

  test('a pack put failing stops the segments waiting their turn: none is put after it failed; the checkpoint fails with its error, nothing still writing', async () => {
    // ~25 segments, all complete only once the one pack is sealed after the walk; slow segment puts
    // keep more than the 16 lanes' worth waiting when the pack fails.
    const root = await mixedTree({ small: new Array<number>(12_000).fill(200), large: [], dup: 1 });
    const before = await describeTree(root);
    const temp = await tempDir('cas-early-pack-fail');
    const sandboxId = uniqueId('cas-early-pack-fail');
    const prefix = `checkpoints/${sandboxId}/`;
    try {
      const watched = watchedStore({ delays: { pack: [100], segment: [150], top: [0] }, failPack: 0 });
      await expect(takeInto(watched.store, root, sandboxId, temp)).rejects.toThrow('injected failure of pack put 0');
      const { events } = watched;
      const failed = events.findIndex((e) => e.kind === 'pack' && e.at === 'end');
      expect(failed).toBeGreaterThanOrEqual(0);
      expect(events.slice(failed).filter((e) => e.kind === 'segment' && e.at === 'start')).toEqual([]);
      await expectNothingLeft(watched, prefix, temp);
      // The retry has every segment: more than the failed attempt put, which stopped short.
      const retried = await retryRestores(root, sandboxId, temp, before);
      const started = events.filter((e) => e.kind === 'segment' && e.at === 'start').length;
      expect(retried.baseline.manifest.segments!.length).toBeGreaterThan(16);
      expect(started).toBeLessThan(retried.baseline.manifest.segments!.length);
    } finally {
      await store.deletePrefix(prefix);
      await fs.rm(root, { recursive: true, force: true });
    }
  }, 180_000);
});
