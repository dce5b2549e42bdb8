import fc from 'fast-check';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import {
  INCOMPRESSIBLE_MIN_BYTES,
  looksIncompressible,
  zstdCompress,
  zstdDecompress,
  zstdDecompressFile,
  zstdRawFrame,
  zstdRawFrameFile,
} from '../../stores/cas/zstd';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// Packs of incompressible chunks are written as zstd frames of raw blocks, built in
// process: the real `zstd -d` (restore's own path) must read every such frame back to
// exactly its bytes, and a chunk misjudged either way must still restore exactly.

const store = s3StoreFromEnv(5 * 1024 * 1024);

/** Text-like bytes (compressible): words from a small vocabulary. */
function text(size: number): Buffer {
  const words = ['const', 'return', 'sandbox', '{', '}', '(', ')', ';', '\n', 'await'];
  const seed = randomBytes(size);
  let out = '';
  for (let i = 0; out.length < size; i += 1) out += `${words[seed[i % size] % words.length]} `;
  return Buffer.from(out.slice(0, size));
}

describe('zstdRawFrame', () => {
  test('zstd -d reads any list of parts back as their bytes, across block boundaries and empty parts', async () => {
    const work = await tempDir('raw-frame');
    const block = 128 * 1024;
    const size = fc.oneof(
      fc.constantFrom(0, 1, block - 1, block, block + 1, 2 * block, 3 * block + 5),
      fc.integer({ min: 0, max: 400_000 }),
    );
    await fc.assert(
      fc.asyncProperty(fc.array(size, { maxLength: 5 }), async (sizes) => {
        const parts = sizes.map((n) => randomBytes(n));
        const whole = Buffer.concat(parts);
        const frame = Buffer.concat(zstdRawFrame(parts, whole.length));
        expect((await zstdDecompress(frame, whole.length, 'frame')).equals(whole)).toBe(true);
        const file = path.join(work, 'pack');
        await fs.writeFile(file, frame);
        expect((await zstdDecompressFile(file, `${file}.plain`, whole.length, 'frame')).equals(whole)).toBe(true);
      }),
      { numRuns: 25 },
    );
  });

  test('refuses a size its parts do not add up to', () => {
    expect(() => zstdRawFrame([Buffer.alloc(10)], 11)).toThrow(/10 bytes, not 11/);
    expect(() => zstdRawFrame([], -1)).toThrow();
  });
});

describe('zstdRawFrameFile (restore reads raw packs without zstd)', () => {
  const block = 128 * 1024;
  const sizes = fc.array(
    fc.oneof(fc.constantFrom(0, 1, block - 1, block, block + 1, 2 * block), fc.integer({ min: 0, max: 300_000 })),
    { maxLength: 4 },
  );

  test('gives back the bytes of any frame zstdRawFrame writes, in shared memory', async () => {
    const file = path.join(await tempDir('raw-file'), 'pack');
    await fc.assert(
      fc.asyncProperty(sizes, async (lengths) => {
        const parts = lengths.map((n) => randomBytes(n));
        const whole = Buffer.concat(parts);
        await fs.writeFile(file, Buffer.concat(zstdRawFrame(parts, whole.length)));
        const payload = await zstdRawFrameFile(file, whole.length);
        expect(payload?.equals(whole)).toBe(true);
        expect(payload?.buffer).toBeInstanceOf(SharedArrayBuffer);
      }),
      { numRuns: 50 },
    );
  });

  test('property: a mutated, cut or extended frame, or another size, is undefined or exactly what zstd -d reads', async () => {
    // What the in-process reader accepts, zstd must read to the same bytes: never a byte zstd would refuse or read otherwise.
    const file = path.join(await tempDir('raw-file'), 'pack');
    const mutation = fc.oneof(
      fc.constant({ kind: 'none' as const }),
      // Flips aimed at the headers (frame and first block) half the time, where the reader decides.
      fc.record({
        kind: fc.constant('flip' as const),
        at: fc.nat(),
        value: fc.integer({ min: 0, max: 255 }),
        header: fc.boolean(),
      }),
      fc.record({ kind: fc.constant('cut' as const), bytes: fc.integer({ min: 1, max: 20 }) }),
      fc.record({ kind: fc.constant('extra' as const), bytes: fc.uint8Array({ minLength: 1, maxLength: 12 }) }),
      fc.record({ kind: fc.constant('size' as const), delta: fc.constantFrom(-1, 1, 1000) }),
    );
    let accepted = 0;
    await fc.assert(
      fc.asyncProperty(sizes, mutation, async (lengths, m) => {
        const parts = lengths.map((n) => randomBytes(n));
        const whole = Buffer.concat(parts);
        let mutated = Buffer.concat(zstdRawFrame(parts, whole.length));
        let size = whole.length;
        if (m.kind === 'flip') mutated[m.at % (m.header ? Math.min(mutated.length, 16) : mutated.length)] = m.value;
        if (m.kind === 'cut') mutated = mutated.subarray(0, Math.max(0, mutated.length - m.bytes));
        if (m.kind === 'extra') mutated = Buffer.concat([mutated, m.bytes]);
        if (m.kind === 'size') size = Math.max(0, size + m.delta);
        await fs.writeFile(file, mutated);
        const payload = await zstdRawFrameFile(file, size);
        const read = await zstdDecompress(mutated, size, 'frame').catch(() => undefined);
        if (payload === undefined) return;
        accepted += 1;
        expect(read).toBeDefined();
        expect(payload.equals(read!)).toBe(true);
      }),
      { numRuns: 100 },
    );
    // Some runs kept a frame the reader takes (no flip, cut or extra byte): the comparison above did happen.
    expect(accepted).toBeGreaterThan(0);
  });

  test('a frame zstd itself wrote goes to zstd (undefined), however incompressible', async () => {
    const data = randomBytes(300_000);
    const file = path.join(await tempDir('raw-file'), 'pack');
    await fs.writeFile(file, await zstdCompress(data));
    expect(await zstdRawFrameFile(file, data.length)).toBeUndefined();
  });
});

describe('looksIncompressible', () => {
  test('random bytes do, text and short chunks do not, and bytes stored raw or not restore the same', () => {
    expect(looksIncompressible(randomBytes(INCOMPRESSIBLE_MIN_BYTES))).toBe(true);
    expect(looksIncompressible(randomBytes(INCOMPRESSIBLE_MIN_BYTES - 1))).toBe(false);
    expect(looksIncompressible(text(1024 * 1024))).toBe(false);
    expect(looksIncompressible(Buffer.alloc(1024 * 1024))).toBe(false);
    // One compressible window is enough to send the chunk to zstd.
    const mostlyRandom = randomBytes(1024 * 1024);
    Buffer.alloc(4096).copy(mostlyRandom, mostlyRandom.length - 4096);
    expect(looksIncompressible(mostlyRandom)).toBe(false);
  });
});

describe('checkpoints with incompressible chunks', () => {
  test('random files go to raw packs, text to zstd ones, and a tree of both restores byte for byte', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({
            kind: fc.constantFrom('random', 'text', 'both', 'zeros'),
            size: fc.oneof(fc.integer({ min: 0, max: 200_000 }), fc.integer({ min: 900_000, max: 3_000_000 })),
          }),
          { minLength: 1, maxLength: 6 },
        ),
        async (files) => {
          const root = await newSandboxRoot();
          for (const [i, { kind, size }] of files.entries()) {
            const half = Math.floor(size / 2);
            const content =
              kind === 'random'
                ? randomBytes(size)
                : kind === 'text'
                  ? text(size)
                  : kind === 'zeros'
                    ? Buffer.alloc(size)
                    : Buffer.concat([randomBytes(half), text(size - half)]);
            await fs.writeFile(path.join(root, 'workspace', `f${i}`), content);
          }
          const sandboxId = uniqueId('cas-raw');
          const before = await describeTree(root);
          const taken = await take(store, root, sandboxId);
          const restored = await restoreFresh(store, taken.checkpoint);
          expect(await describeTree(restored.target)).toEqual(before);
          const randomBytesTaken = files
            .filter((f) => f.kind === 'random')
            .reduce((sum, f) => sum + (f.size >= INCOMPRESSIBLE_MIN_BYTES ? f.size : 0), 0);
          // Random files of a chunk's worth went raw; nothing but random bytes did.
          if (randomBytesTaken > 0) expect(taken.stats.rawPacks).toBeGreaterThan(0);
          if (files.every((f) => f.kind === 'text' || f.kind === 'zeros')) expect(taken.stats.rawPacks).toBe(0);
          await store.deletePrefix(`checkpoints/${sandboxId}/`);
        },
      ),
      { numRuns: 8 },
    );
  });

  test('a chunk whose sampled windows are random but the rest zeros is misjudged as raw, and still restores exactly', async () => {
    const root = await newSandboxRoot();
    const size = 512 * 1024;
    const content = Buffer.alloc(size);
    // Random bytes exactly where the four windows are read (start, thirds, end); zeros elsewhere.
    const step = Math.floor((size - 4096) / 3);
    for (let s = 0; s < 4; s += 1) randomBytes(4096).copy(content, s * step);
    expect(looksIncompressible(content)).toBe(true);
    await fs.writeFile(path.join(root, 'workspace', 'tricky.bin'), content);
    const sandboxId = uniqueId('cas-raw-tricky');
    const before = await describeTree(root);
    const taken = await take(store, root, sandboxId);
    expect(taken.stats.rawPacks).toBe(1);
    // The guess costs size only: stored as it is, plus the frame's few bytes.
    expect(taken.stats.packBytes).toBeLessThan(size + 100);
    const restored = await restoreFresh(store, taken.checkpoint);
    expect(await describeTree(restored.target)).toEqual(before);
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });
});
