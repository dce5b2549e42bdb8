import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { MANIFEST_SUFFIX } from '../../stores/cas/manifest';
import { repeatCheckpoint } from '../../stores/cas/upload';
import { s3StoreFromEnv, uniqueId } from '../providers/helpers';
import { describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// repeatCheckpoint stores the top object as soon as the caller's cheap sign (`likely`) says the files
// are unchanged, while the proof (`unchanged`) and the baseline's HEAD are still out. Against a real
// MinIO, with the three settling in any order, the PUT slow or failing: a checkpoint is returned only
// when proven, and this release's top object is in the store exactly when one is returned.

const store = s3StoreFromEnv();

/** `inner`, with the top object's PUT held `delayMs` and failed when `fails`. */
function slowTop(inner: CheckpointStore, delayMs: number, fails: boolean): CheckpointStore {
  const wrapped = Object.create(inner) as CheckpointStore;
  wrapped.putBytes = async (key, bytes, labels, signal, sha256) => {
    if (key.endsWith(MANIFEST_SUFFIX)) {
      await new Promise((resolve) => setTimeout(resolve, delayMs));
      // Failed after the bytes are in: storeTop must delete what it stored.
      if (fails) {
        await inner.putBytes(key, bytes, labels, signal, sha256);
        throw new Error('injected: the answer to the top object PUT was lost');
      }
    }
    return inner.putBytes(key, bytes, labels, signal, sha256);
  };
  return wrapped;
}

/** A promise of `value` after `ms` (rejected when value is an Error). */
function after<T>(ms: number, value: T | Error): Promise<T> {
  return new Promise((resolve, reject) =>
    setTimeout(() => (value instanceof Error ? reject(value) : resolve(value)), ms),
  );
}

let sandboxId: string;
let root: string;
let taken: Awaited<ReturnType<typeof take>>;
beforeAll(async () => {
  root = await newSandboxRoot();
  sandboxId = uniqueId('cas-repeat');
  await fs.mkdir(path.join(root, 'workspace', 'src'));
  for (let i = 0; i < 40; i++) await fs.writeFile(path.join(root, 'workspace', 'src', `f${i}.txt`), `file ${i}\n`);
  await fs.symlink('src/f0.txt', path.join(root, 'workspace', 'link'));
  taken = await take(store, root, sandboxId);
}, 60_000);

test('property: a repeated checkpoint is returned only when proven, and its top object is in the store exactly then', async () => {
  const prefix = `checkpoints/${sandboxId}/`;
  const seen = { repeated: 0, speculativeDiscarded: 0 };
  await fc.assert(
    fc.asyncProperty(
      fc.record({
        likely: fc.boolean(),
        unchanged: fc.constantFrom(true, false, 'throws' as const),
        baselineLive: fc.boolean(),
        likelyMs: fc.nat(20),
        unchangedMs: fc.nat(40),
        putMs: fc.nat(40),
        putFails: fc.boolean(),
      }),
      async (c) => {
        const name = uniqueId('r');
        const uri = store.uriOf(`${prefix}${name}${MANIFEST_SUFFIX}`);
        // A baseline whose checkpoint is gone: its uri, in the same prefix, names nothing.
        const baseline = c.baselineLive
          ? taken.baseline
          : { ...taken.baseline, uri: store.uriOf(`${prefix}${uniqueId('gone')}${MANIFEST_SUFFIX}`) };
        const proof = c.unchanged === 'throws' ? new Error('injected: the proof failed') : c.unchanged;
        const outcome = await repeatCheckpoint({
          store: slowTop(store, c.putMs, c.putFails),
          prefix,
          name,
          labels: {},
          limits: DEFAULT_ARCHIVE_LIMITS,
          baseline,
          likely: after(c.likelyMs, c.likely),
          unchanged: after(c.likelyMs + c.unchangedMs, proof),
        }).then(
          (result) => ({ result }),
          (err: unknown) => ({ err }),
        );
        const proven = c.baselineLive && c.unchanged === true;
        if (c.unchanged === 'throws') expect('err' in outcome).toBe(true);
        else if (!proven) expect(outcome).toEqual({ result: undefined });
        else if (c.putFails) expect('err' in outcome).toBe(true);
        else {
          if (!('result' in outcome) || !outcome.result)
            throw new Error(`expected a checkpoint, got ${String(outcome)}`);
          expect(outcome.result.checkpoint.uri).toBe(uri);
          expect(outcome.result.baseline.uri).toBe(uri);
          seen.repeated += 1;
        }
        if (c.likely && !proven && !c.putFails) seen.speculativeDiscarded += 1;
        // In the store exactly when returned.
        expect(await store.exists(uri)).toBe('result' in outcome && outcome.result !== undefined);
      },
    ),
    { numRuns: 60 },
  );
  // The runs reached both ways: repeats, and top objects stored ahead of a proof that then failed.
  expect(seen.repeated).toBeGreaterThan(0);
  expect(seen.speculativeDiscarded).toBeGreaterThan(0);
}, 300_000);

test('a repeated checkpoint restores byte for byte', async () => {
  const repeated = await repeatCheckpoint({
    store,
    prefix: `checkpoints/${sandboxId}/`,
    name: uniqueId('r'),
    labels: {},
    limits: DEFAULT_ARCHIVE_LIMITS,
    baseline: taken.baseline,
    likely: Promise.resolve(true),
    unchanged: after(30, true),
  });
  if (!repeated) throw new Error('expected a repeated checkpoint');
  expect(repeated.checkpoint.uri).not.toBe(taken.checkpoint.uri);
  const { target } = await restoreFresh(store, repeated.checkpoint);
  expect(await describeTree(target)).toEqual(await describeTree(root));
}, 60_000);

test('limits the baseline no longer meets refuse the repeat only once it is proven; unproven, nothing is stored', async () => {
  const prefix = `checkpoints/${sandboxId}/`;
  const limits = { ...DEFAULT_ARCHIVE_LIMITS, maxEntries: 3 };
  for (const unchanged of [true, false]) {
    const name = uniqueId('r');
    const attempt = repeatCheckpoint({
      store,
      prefix,
      name,
      labels: {},
      limits,
      baseline: taken.baseline,
      likely: Promise.resolve(true),
      unchanged: after(20, unchanged),
    });
    if (unchanged) await expect(attempt).rejects.toThrow(/entries|limit/i);
    else await expect(attempt).resolves.toBeUndefined();
    expect(await store.exists(store.uriOf(`${prefix}${name}${MANIFEST_SUFFIX}`))).toBe(false);
  }
}, 60_000);
