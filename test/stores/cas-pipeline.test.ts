import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { CHUNK_SIZES, cutPoints, GEAR_SCAN_WASM, gearTable, wasmCutPoints } from '../../stores/cas/fastcdc';
import { chunkHash, cutAndHash } from '../../stores/cas/hasher';
import { MANIFEST_SUFFIX, PACK_SUFFIX } from '../../stores/cas/manifest';
import { takeCheckpoint } from '../../stores/cas/upload';
import { passThrough } from '../helpers/store-wrap';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree, NAMES, newSandboxRoot, restoreFresh } from './cas-helpers';

// The upload pipeline of the content-addressed checkpoints (packs written, compressed and put in
// overlapping stages, more packs queued than put at once) against a real MinIO, with puts that
// finish out of order and one that fails while its request is in flight.

const store = s3StoreFromEnv(5 * 1024 * 1024);

/** The real store, each pack put delayed as `delays` says, and the put numbered `failAt` failing after reading some of its body. */
function faultyStore(delays: number[], failAt: number | undefined): { store: CheckpointStore; packPuts: () => number } {
  let packPuts = 0;
  const wrapped: CheckpointStore = {
    ...passThrough(store),
    async putBytes(key: string, bytes: Buffer, labels: Record<string, string>, signal?: AbortSignal) {
      if (!key.endsWith(PACK_SUFFIX)) return store.putBytes(key, bytes, labels, signal);
      const n = packPuts++;
      await delay(delays[n % delays.length]);
      if (n === failAt) {
        // A fault inside the put: its request is cancelled in flight (or, if it won the race, its answer is lost).
        const cut = new AbortController();
        const putting = store.putBytes(key, bytes, labels, cut.signal).catch(() => undefined);
        setImmediate(() => cut.abort(new Error('cut')));
        await putting;
        throw new Error(`injected failure of pack put ${n}`);
      }
      return store.putBytes(key, bytes, labels, signal);
    },
  };
  return { store: wrapped, packPuts: () => packPuts };
}

describe('FastCDC in WebAssembly', () => {
  const gear = gearTable();
  test('cuts exactly where the JavaScript FastCDC cuts, whatever the sizes and the data', () => {
    const wasm = wasmCutPoints(Buffer.from(GEAR_SCAN_WASM, 'base64'), gear);
    const sizes = fc
      .tuple(fc.integer({ min: 1, max: 400 }), fc.integer({ min: 2, max: 2000 }), fc.integer({ min: 1, max: 4000 }))
      .map(([min, avg, extra]) => ({ min, avg, max: Math.max(min, avg) + extra }));
    // Runs of one byte (zeros, text) as well as random bytes: the masks then meet no cut or many.
    const data = fc.oneof(
      fc.uint8Array({ maxLength: 30_000 }),
      fc.tuple(fc.nat(30_000), fc.nat(255)).map(([length, byte]) => new Uint8Array(length).fill(byte)),
    );
    fc.assert(
      fc.property(data, sizes, fc.boolean(), (bytes, { min, avg, max }, eof) => {
        expect(wasm(bytes, eof, min, avg, max)).toEqual(cutPoints(bytes, eof, min, avg, max, gear));
      }),
      { numRuns: 500 },
    );
  });

  test('the hashing thread cuts large pieces as cutPoints does and hashes each chunk', async () => {
    for (const size of [0, 1000, CHUNK_SIZES.max + 12_345, 3 * CHUNK_SIZES.max]) {
      const data = Buffer.from(new SharedArrayBuffer(size));
      bytes(size).copy(data);
      for (const eof of [true, false]) {
        const { ends, hashes } = await cutAndHash(data, eof);
        const expected = cutPoints(data, eof, CHUNK_SIZES.min, CHUNK_SIZES.avg, CHUNK_SIZES.max, gear);
        expect(ends).toEqual(expected);
        expect(hashes).toEqual(expected.map((end, i) => chunkHash(data.subarray(expected[i - 1] ?? 0, end))));
      }
    }
  });
});

describe('checkpoint upload pipeline', () => {
  test('packs stored out of order restore byte for byte; a put failing part-way fails the checkpoint, leaves no temporary file and no manifest', async () => {
    // About 96 MB of incompressible large files and a few hundred small ones: ten packs and more, more than
    // are ever put at once or queued behind the puts.
    const root = await newSandboxRoot();
    for (let i = 0; i < 12; i += 1)
      await fs.writeFile(path.join(root, 'workspace', `large-${i}.bin`), bytes(8_000_000 + i * 1000));
    await fs.mkdir(path.join(root, 'home', 'src'));
    for (let i = 0; i < 300; i += 1) await fs.writeFile(path.join(root, 'home', 'src', `f${i}.ts`), bytes(1 + i * 37));
    const before = await describeTree(root);
    const temp = await tempDir('cas-pipeline');
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.nat(60), { minLength: 11, maxLength: 11 }),
        fc.option(fc.nat(9), { nil: undefined, freq: 2 }),
        async (delays, failAt) => {
          const sandboxId = uniqueId('cas-pipeline');
          const prefix = `checkpoints/${sandboxId}/`;
          const faulty = faultyStore(delays, failAt);
          const taking = takeCheckpoint({
            store: faulty.store,
            rootDir: root,
            names: NAMES,
            prefix,
            name: uniqueId('t'),
            labels: {},
            limits: DEFAULT_ARCHIVE_LIMITS,
            progress: { bytes: 0 },
            tempPrefix: path.join(temp, sandboxId),
          });
          try {
            if (failAt !== undefined) {
              await expect(taking).rejects.toThrow(`injected failure of pack put ${failAt}`);
              // Nothing names the packs that made it: no manifest was written.
              expect((await store.list(prefix)).filter((o) => o.key.endsWith(MANIFEST_SUFFIX))).toEqual([]);
            } else {
              const taken = await taking;
              expect(faulty.packPuts()).toBeGreaterThan(9);
              const restored = await restoreFresh(store, taken.checkpoint);
              expect(await describeTree(restored.target)).toEqual(before);
              await fs.rm(restored.target, { recursive: true, force: true });
            }
            // Every temporary pack file is gone, whether the checkpoint was taken or failed.
            expect(await fs.readdir(temp)).toEqual([]);
          } finally {
            await store.deletePrefix(prefix);
          }
        },
      ),
      // One run that must succeed with every put at once, whatever the generator draws.
      { numRuns: 6, examples: [[new Array<number>(11).fill(0), undefined]] },
    );
  }, 240_000);
});
