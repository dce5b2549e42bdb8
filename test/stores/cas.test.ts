import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { setTimeout as delay } from 'node:timers/promises';
import { storedObject } from '../helpers/s3';
import {
  isBaselineEntry,
  isChunkLocation,
  RACY_MARGIN_NS,
  readBaseline,
  removeBaseline,
  writeBaseline,
} from '../../stores/cas/baseline';
import { cutPoints, gearTable } from '../../stores/cas/fastcdc';
import {
  compressSegment,
  encodeManifest,
  Manifest,
  ManifestEntry,
  SEGMENT_SUFFIX,
  segmentsPrefixOf,
  ZSTD_MANIFEST_SUFFIX,
} from '../../stores/cas/manifest';
import { s3StoreFromEnv, stasisError, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// The content-addressed checkpoint engine against a real MinIO: what is restored
// from the store equals what was taken, byte for byte and in its metadata; an
// unchanged tree uploads nothing; a corrupt or missing pack is named, never skipped.

const store = s3StoreFromEnv(5 * 1024 * 1024);
const racyMarginMs = Number(RACY_MARGIN_NS / 1_000_000n) + 10;

describe('FastCDC', () => {
  const gear = gearTable();
  test('cuts do not depend on how the stream is split; no chunk is longer than max', () => {
    fc.assert(
      fc.property(
        fc.uint8Array({ minLength: 0, maxLength: 20_000 }),
        fc.array(fc.nat(20_000), { maxLength: 6 }),
        (data, splits) => {
          const whole = cutPoints(data, true, 64, 256, 1024, gear);
          // Fed in pieces, carrying what is not cut yet, as the uploader does.
          const cuts: number[] = [];
          let carried = new Uint8Array(0);
          let base = 0;
          const points = [...new Set(splits.map((s) => s % (data.length + 1)))].sort((a, b) => a - b);
          let from = 0;
          for (const to of [...points, data.length]) {
            const piece = new Uint8Array([...carried, ...data.subarray(from, to)]);
            const eof = to === data.length;
            const ends = cutPoints(piece, eof, 64, 256, 1024, gear);
            for (const end of ends) cuts.push(base + end);
            const last = ends.length > 0 ? ends[ends.length - 1] : 0;
            carried = piece.subarray(last);
            base += last;
            from = to;
          }
          expect(cuts).toEqual(whole);
          expect(whole.length === 0 ? 0 : whole[whole.length - 1]).toBe(data.length);
          for (let i = 0; i < whole.length; i += 1) expect(whole[i] - (whole[i - 1] ?? 0)).toBeLessThanOrEqual(1024);
        },
      ),
      { numRuns: 200 },
    );
  });

  test('an insertion near the start of 200 KiB of data leaves most chunks as they were', () => {
    const data = bytes(200 * 1024);
    const edited = Buffer.concat([data.subarray(0, 1000), Buffer.from('inserted'), data.subarray(1000)]);
    const chunksOf = (buf: Buffer) => {
      const ends = cutPoints(buf, true, 256, 1024, 4096, gear);
      return new Set(ends.map((end, i) => buf.subarray(ends[i - 1] ?? 0, end).toString('hex')));
    };
    const before = chunksOf(data);
    const after = [...chunksOf(edited)];
    const kept = after.filter((chunk) => before.has(chunk)).length;
    expect(kept).toBeGreaterThan(after.length * 0.9);
  });
});

describe('content-addressed checkpoints', () => {
  test('random trees restore from the store byte for byte, with modes, mtimes and symlinks verbatim', async () => {
    const name = fc.stringMatching(/^[a-z0-9._ -]{1,12}$/).filter((n) => n !== '.' && n !== '..');
    const node = fc.oneof(
      fc.record({
        kind: fc.constant('file' as const),
        size: fc.oneof(fc.constant(0), fc.nat(3000), fc.integer({ min: 900_000, max: 1_300_000 })),
        // Some the umask takes bits from when the restore creates the file (0o666, 0o1777): then set apart.
        mode: fc.constantFrom(0o644, 0o600, 0o755, 0o4755, 0o2775, 0o666, 0o000, 0o1777),
      }),
      fc.record({
        kind: fc.constant('link' as const),
        target: fc.oneof(fc.constant('/usr/bin/python3'), fc.constant('../x'), name, fc.constant('/etc/passwd')),
      }),
      fc.record({ kind: fc.constant('dir' as const), mode: fc.constantFrom(0o755, 0o700, 0o555) }),
    );
    const tree = fc.array(
      fc.record({ top: fc.constantFrom('workspace', 'home', 'envs'), dir: fc.option(name), name, node }),
      { maxLength: 12 },
    );
    await fc.assert(
      fc.asyncProperty(tree, async (entries) => {
        const root = await newSandboxRoot();
        for (const { top, dir, name: leaf, node: n } of entries) {
          const parent = path.join(root, top, dir ?? '');
          // Beneath a symlink drawn earlier (dangling, or to a file) there is no directory to make: skipped.
          const made = await fs.mkdir(parent, { recursive: true }).then(
            () => true,
            () => false,
          );
          if (!made) continue;
          const file = path.join(parent, leaf);
          const exists = await fs.lstat(file).then(
            () => true,
            () => false,
          );
          if (exists) continue;
          if (n.kind === 'file') {
            await fs.writeFile(file, bytes(n.size));
            await fs.chmod(file, n.mode);
            await fs.utimes(file, 1_600_000_000.123456, 1_600_000_000.123456 + Math.random());
          } else if (n.kind === 'link') await fs.symlink(n.target, file);
          else await fs.mkdir(file, { mode: n.mode });
        }
        const sandboxId = uniqueId('cas-prop');
        const before = await describeTree(root);
        const taken = await take(store, root, sandboxId);
        const restored = await restoreFresh(store, taken.checkpoint);
        expect(await describeTree(restored.target)).toEqual(before);
        expect(restored.labels).toEqual({ run: 'r1' });
        await fs.chmod(root, 0o755);
        await store.deletePrefix(`checkpoints/${sandboxId}/`);
      }),
      { numRuns: 12 },
    );
  });

  test('an unchanged tree uploads no file data; one changed file uploads about that file; an append to a large file reuses its chunks', async () => {
    const root = await newSandboxRoot();
    const sandboxId = uniqueId('cas-incr');
    await fs.mkdir(path.join(root, 'workspace', 'src'));
    for (let i = 0; i < 50; i += 1) await fs.writeFile(path.join(root, 'workspace', 'src', `f${i}.ts`), bytes(4000));
    await fs.writeFile(path.join(root, 'workspace', 'big.bin'), bytes(12 * 1024 * 1024));
    // Past the racy window, so the stats alone can tell the files did not change.
    await delay(racyMarginMs);
    const first = await take(store, root, sandboxId);
    expect(first.stats.filesHashed).toBe(51);
    expect(first.stats.packBytes).toBeGreaterThan(12 * 1024 * 1024);
    await delay(racyMarginMs);

    const unchanged = await take(store, root, sandboxId, first.baseline);
    // Only the top object goes out: every segment is the first checkpoint's.
    expect(unchanged.stats).toMatchObject({ filesHashed: 0, packBytes: 0, packs: 0, segments: 0, segmentBytes: 0 });

    await fs.writeFile(path.join(root, 'workspace', 'src', 'f7.ts'), bytes(5000));
    await delay(racyMarginMs);
    const oneFile = await take(store, root, sandboxId, unchanged.baseline);
    expect(oneFile.stats.filesHashed).toBe(1);
    expect(oneFile.stats.packBytes).toBeGreaterThan(4000);
    expect(oneFile.stats.packBytes).toBeLessThan(5100);
    expect(oneFile.stats.segments).toBe(1);

    await fs.appendFile(path.join(root, 'workspace', 'big.bin'), bytes(1024 * 1024));
    const appended = await take(store, root, sandboxId, oneFile.baseline);
    expect(appended.stats.filesHashed).toBe(1);
    // The new MiB and at most the chunk it joined (chunks are 4 MiB at most).
    expect(appended.stats.packBytes).toBeLessThan(5.1 * 1024 * 1024);
    expect(appended.stats.segments).toBe(1);

    // Restored from the store alone (another host), then taken again from the restore's baseline: nothing to upload.
    const restored = await restoreFresh(store, appended.checkpoint);
    expect(await describeTree(restored.target)).toEqual(await describeTree(root));
    await delay(racyMarginMs);
    const afterResume = await take(store, restored.target, sandboxId, restored.baseline);
    expect(afterResume.stats).toMatchObject({ filesHashed: 0, packBytes: 0 });
    const again = await restoreFresh(store, afterResume.checkpoint);
    expect(await describeTree(again.target)).toEqual(await describeTree(root));
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });

  test('a corrupt pack and a missing pack are CHECKPOINT_INVALID naming them; nothing is skipped', async () => {
    const root = await newSandboxRoot();
    const sandboxId = uniqueId('cas-bad');
    await fs.writeFile(path.join(root, 'workspace', 'a.txt'), bytes(3000));
    const taken = await take(store, root, sandboxId);
    const [pack] = taken.baseline.manifest.packs;
    const object = storedObject(pack.uri);
    await object.write(bytes(pack.bytes));
    const corrupt = await stasisError(restoreFresh(store, taken.checkpoint), 'CHECKPOINT_INVALID');
    expect(corrupt.message).toContain(object.key);
    await store.delete(pack.uri);
    const missing = await stasisError(restoreFresh(store, taken.checkpoint), 'CHECKPOINT_INVALID');
    expect(missing.message).toContain(pack.uri);
    expect(missing.message).toContain('missing');
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });

  // Packs are downloaded with their size checked, not their hash (each chunk taken is hashed instead):
  // any one changed byte of any pack either fails the restore naming that pack or changes nothing restored.
  test('one byte of a pack changed, anywhere: CHECKPOINT_INVALID naming the pack, or the tree exactly as taken', async () => {
    const root = await newSandboxRoot();
    const sandboxId = uniqueId('cas-flip');
    // A pack of raw blocks (random bytes) and a zstd-compressed one (text).
    await fs.writeFile(path.join(root, 'workspace', 'random.bin'), bytes(300 * 1024));
    for (let i = 0; i < 20; i += 1) {
      await fs.writeFile(path.join(root, 'workspace', `src${i}.txt`), `line ${i}\n`.repeat(200 + i));
    }
    await delay(racyMarginMs);
    const expected = await describeTree(root);
    const taken = await take(store, root, sandboxId);
    const packs = taken.baseline.manifest.packs;
    expect(packs.length).toBeGreaterThanOrEqual(1);
    const objects = packs.map((pack) => storedObject(pack.uri));
    const originals = await Promise.all(objects.map((object) => object.read()));
    let failed = 0;
    let intact = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.nat(packs.length - 1),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        fc.integer({ min: 1, max: 255 }),
        async (which, where, mask) => {
          const original = originals[which];
          const changed = Buffer.from(original);
          const at = Math.floor(where * changed.length);
          changed[at] ^= mask;
          const object = objects[which];
          await object.write(changed);
          try {
            const outcome = await restoreFresh(store, taken.checkpoint).then(
              async ({ target }) => ({ tree: await describeTree(target) }),
              (err: unknown) => ({ err }),
            );
            if ('err' in outcome) {
              failed += 1;
              expect(outcome.err).toMatchObject({ code: 'CHECKPOINT_INVALID' });
              expect((outcome.err as Error).message).toContain(object.key);
            } else {
              intact += 1;
              expect(outcome.tree).toEqual(expected);
            }
          } finally {
            await object.write(original);
          }
        },
      ),
      { numRuns: 30 },
    );
    // Nearly every byte of a pack is a chunk's: most changes must have been caught.
    expect(failed).toBeGreaterThan(intact);
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });

  test('a pack shorter or longer than its ref: CHECKPOINT_INVALID naming it', async () => {
    const root = await newSandboxRoot();
    const sandboxId = uniqueId('cas-size');
    await fs.writeFile(path.join(root, 'workspace', 'a.bin'), bytes(5000));
    const taken = await take(store, root, sandboxId);
    const object = storedObject(taken.baseline.manifest.packs[0].uri);
    const original = await object.read();
    for (const body of [original.subarray(0, original.length - 1), Buffer.concat([original, Buffer.from([0])])]) {
      await object.write(body);
      const err = await stasisError(restoreFresh(store, taken.checkpoint), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(object.key);
    }
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });
});

describe('segmented manifests (stasis-cas-2)', () => {
  /** `files` small files in directories of 40, like node_modules. */
  async function tree(files: number) {
    const root = await newSandboxRoot();
    for (let i = 0; i < files; i += 1) {
      const dir = path.join(root, 'workspace', `pkg${Math.floor(i / 40)}`);
      if (i % 40 === 0) await fs.mkdir(dir);
      await fs.writeFile(path.join(dir, `f${i}.js`), bytes(200 + (i % 50)));
    }
    await delay(racyMarginMs);
    return root;
  }

  test('an unchanged re-suspend writes the top object alone; a change, an addition and a removal rewrite only their own segments', async () => {
    const root = await tree(3000);
    const sandboxId = uniqueId('cas-seg');
    const first = await take(store, root, sandboxId);
    const count = first.baseline.manifest.segments!.length;
    expect(count).toBeGreaterThan(5);
    expect(first.stats.segments).toBe(count);
    // The top object names segments and packs only: a small fraction of the segments' bytes.
    expect(first.stats.topBytes * 5).toBeLessThan(first.stats.segmentBytes);
    await delay(racyMarginMs);
    const unchanged = await take(store, root, sandboxId, first.baseline);
    expect(unchanged.stats).toMatchObject({ filesHashed: 0, packs: 0, segments: 0 });
    expect(unchanged.baseline.manifest.segments).toEqual(first.baseline.manifest.segments);

    const target = path.join(root, 'workspace', 'pkg40', 'f1600.js');
    await fs.writeFile(target, bytes(300));
    await delay(racyMarginMs);
    const changed = await take(store, root, sandboxId, unchanged.baseline);
    expect(changed.stats).toMatchObject({ filesHashed: 1, segments: 1 });
    const names = (taken: typeof first) => new Set(taken.baseline.manifest.segments!.map(([name]) => name));
    const kept = [...names(changed)].filter((name) => names(unchanged).has(name)).length;
    expect(kept).toBe(count - 1);

    await fs.writeFile(path.join(root, 'workspace', 'pkg10', 'added.js'), bytes(100));
    await fs.rm(path.join(root, 'workspace', 'pkg60', 'f2405.js'));
    await delay(racyMarginMs);
    const edited = await take(store, root, sandboxId, changed.baseline);
    // Each edit touches its own segment (an added path that is a boundary splits one in two).
    expect(edited.stats.segments).toBeGreaterThanOrEqual(2);
    expect(edited.stats.segments).toBeLessThanOrEqual(4);
    for (const taken of [first, changed, edited]) {
      const restored = await restoreFresh(store, taken.checkpoint);
      expect(restored.baseline.manifest.segments).toEqual(taken.baseline.manifest.segments);
    }
    expect(await describeTree((await restoreFresh(store, edited.checkpoint)).target)).toEqual(await describeTree(root));
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });

  test('a corrupt segment and a missing segment are CHECKPOINT_INVALID naming them; nothing is written', async () => {
    const root = await tree(1500);
    const sandboxId = uniqueId('cas-seg-bad');
    const taken = await take(store, root, sandboxId);
    const [name, storedBytes] = taken.baseline.manifest.segments![1];
    const uri = `${segmentsPrefixOf(taken.checkpoint.uri)}${name}${SEGMENT_SUFFIX}`;
    const object = storedObject(uri);
    // Well-formed deflate of other JSON, of the declared size at most.
    const other = await compressSegment(
      Buffer.from('{"format":"stasis-cas-2-segment","packs":[],"chunks":{},"entries":[]}'),
    );
    expect(other.length).toBeLessThanOrEqual(storedBytes);
    await object.write(other);
    const target = await tempDir('cas-seg-target');
    const restoreInto = () => restoreFresh(store, taken.checkpoint, target);
    const corrupt = await stasisError(restoreInto(), 'CHECKPOINT_INVALID');
    expect(corrupt.message).toContain(uri);
    expect(corrupt.message).toContain('corrupt segment');
    await store.delete(uri);
    const missing = await stasisError(restoreInto(), 'CHECKPOINT_INVALID');
    expect(missing.message).toContain(uri);
    expect(missing.message).toContain('missing');
    expect(await fs.readdir(target)).toEqual([]);
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });

  test('a stasis-cas-1 checkpoint still restores, and the next checkpoint from its baseline is stasis-cas-2 with no file data', async () => {
    const root = await tree(200);
    const sandboxId = uniqueId('cas-v1');
    const taken = await take(store, root, sandboxId);
    // The same checkpoint as an earlier version wrote it: one object (zstd), every entry and chunk in it.
    const v1 = await store.put(
      `checkpoints/${sandboxId}/v1${ZSTD_MANIFEST_SUFFIX}`,
      Readable.from([await encodeManifest(taken.baseline.manifest)]),
      { run: 'r1' },
    );
    const restored = await restoreFresh(store, v1);
    expect(restored.baseline.manifest.format).toBe('stasis-cas-1');
    expect(restored.labels).toEqual({ run: 'r1' });
    expect(await describeTree(restored.target)).toEqual(await describeTree(root));
    await delay(racyMarginMs);
    const next = await take(store, restored.target, sandboxId, restored.baseline);
    expect(next.stats).toMatchObject({ filesHashed: 0, packBytes: 0 });
    expect(next.baseline.manifest.format).toBe('stasis-cas-2');
    expect(await describeTree((await restoreFresh(store, next.checkpoint)).target)).toEqual(await describeTree(root));
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });
});

describe('baseline checks', () => {
  // Values near the schema: each field valid, or one of a few wrong values of its kind.
  const hash = fc.stringMatching(/^[0-9a-f]{64}$/);
  const wrong = fc.constantFrom<unknown>(
    undefined,
    null,
    -1,
    1.5,
    NaN,
    Infinity,
    '',
    'x',
    '12a',
    [],
    {},
    'f',
    0,
    '0'.repeat(26),
  );
  const field = <T>(valid: fc.Arbitrary<T>) =>
    fc.oneof({ weight: 5, arbitrary: valid }, { weight: 1, arbitrary: wrong });
  const count = fc.oneof(fc.nat(), fc.constant(-0));
  const ns = fc.stringMatching(/^[0-9]{1,25}$/);

  test('the hand-written entry check accepts exactly what the manifest entry schema accepts', () => {
    const entry = fc.record(
      {
        p: field(fc.string()),
        k: field(fc.constantFrom('d', 'f', 'l', 'h')),
        m: field(count),
        s: field(count),
        mt: field(ns),
        ct: field(ns),
        l: field(fc.string()),
        c: field(fc.array(fc.oneof({ weight: 8, arbitrary: hash }, { weight: 1, arbitrary: wrong }), { maxLength: 3 })),
        extra: fc.anything(),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(fc.oneof(entry, wrong), (value) => {
        expect(isBaselineEntry(value)).toBe(ManifestEntry.safeParse(value).success);
      }),
      { numRuns: 2000 },
    );
  });

  test('the hand-written chunk location check accepts exactly what the manifest schema accepts', () => {
    const location = fc.oneof(
      fc.tuple(field(count), field(count), field(fc.oneof(count, fc.integer({ min: 1 })))),
      fc.array(count, { maxLength: 4 }),
      wrong,
    );
    fc.assert(
      // zod passes a `__proto__` key over unchecked; the hand-written check refuses it (stricter is safe here).
      fc.property(
        fc.oneof(
          hash,
          fc.string().filter((key) => key !== '__proto__'),
        ),
        location,
        (key, value) => {
          expect(isChunkLocation(key, value)).toBe(Manifest.shape.chunks.safeParse({ [key]: value }).success);
        },
      ),
      { numRuns: 2000 },
    );
  });
});

describe('baseline files', () => {
  test('a baseline read again is the one in the file, whoever replaced it since; one that cannot be read is none', async () => {
    const root = await newSandboxRoot();
    await fs.writeFile(path.join(root, 'workspace', 'a'), bytes(100));
    const sandboxId = uniqueId('cas-baseline-file');
    const { baseline } = await take(store, root, sandboxId);
    const file = path.join(await tempDir('cas-baseline'), 'baseline.json');
    await writeBaseline(file, baseline);
    const read = await readBaseline(file);
    expect(read).toEqual(baseline);
    // Another writer (another worker process on the host) replaces the file in place and by rename.
    const other = { ...baseline, uri: `${baseline.uri}.other` };
    await fs.writeFile(file, JSON.stringify(other));
    expect((await readBaseline(file))?.uri).toBe(other.uri);
    const renamed = `${file}.new`;
    await fs.writeFile(renamed, JSON.stringify({ ...baseline, uri: `${baseline.uri}.renamed` }));
    await fs.rename(renamed, file);
    expect((await readBaseline(file))?.uri).toBe(`${baseline.uri}.renamed`);
    await fs.writeFile(file, '{"torn":');
    expect(await readBaseline(file)).toBeUndefined();
    await writeBaseline(file, baseline);
    await removeBaseline(file);
    expect(await readBaseline(file)).toBeUndefined();
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
  });
});

describe('zstd command', () => {
  test('is found on this host and a missing command is reported absent, not thrown', async () => {
    const { zstdAvailable } = await import('../../stores/cas/zstd');
    expect(await zstdAvailable()).toBe(true);
    expect(await zstdAvailable('stasis-no-such-zstd')).toBe(false);
  });
});
