import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { deflateRawSync } from 'node:zlib';
import { createHash } from 'node:crypto';
import type { CheckpointStore } from '../../stores/api';
import { nowNs, RACY_MARGIN_NS, type Baseline } from '../../stores/cas/baseline';
import { pastRacyWindow } from '../../stores/cas/restore';
import {
  MANIFEST_SUFFIX,
  PACK_SUFFIX,
  SEGMENT_SUFFIX,
  SEGMENTS_DIR,
  splitManifest,
  storedMtime,
  ZSTD_MANIFEST_SUFFIX,
  type Manifest,
} from '../../stores/cas/manifest';
import { zstdCompress } from '../../stores/cas/zstd';
import { passThrough } from '../helpers/store-wrap';
import { s3StoreFromEnv, uniqueId } from '../providers/helpers';
import { bytes, describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// A checkpoint restored from the store on another host (a fresh directory: new inodes, new ctimes)
// and suspended again: nothing of the first host is in what is stored, so an unchanged re-suspend
// writes the top object alone and a one-file change one segment and its pack; the restore's
// baseline lets the re-suspend trust the restored files' stats, yet a change made after the restore
// in the same clock tick (its ctime as recorded) is read again. Checkpoints of the unreleased
// writer before this one (segments with ctimes, a zstd top object) still restore.

const inner = s3StoreFromEnv(5 * 1024 * 1024);
/** Keys written to the store since the last `written()`. */
const puts: string[] = [];
const store: CheckpointStore = {
  ...passThrough(inner),
  put: (key, ...rest) => {
    puts.push(key);
    return inner.put(key, ...rest);
  },
  putBytes: (key, ...rest) => {
    puts.push(key);
    return inner.putBytes(key, ...rest);
  },
};
function written(): { tops: number; segments: number; packs: number; other: number } {
  const counts = { tops: 0, segments: 0, packs: 0, other: 0 };
  for (const key of puts.splice(0)) {
    if (key.endsWith(MANIFEST_SUFFIX)) counts.tops += 1;
    else if (key.endsWith(SEGMENT_SUFFIX)) counts.segments += 1;
    else if (key.endsWith(PACK_SUFFIX)) counts.packs += 1;
    else counts.other += 1;
  }
  return counts;
}

/** Random trees: files small and empty, directories, symlinks and hardlinks, in all three checkpoint directories. */
const name = fc.stringMatching(/^[a-z0-9._-]{1,10}$/).filter((n) => n !== '.' && n !== '..');
const node = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({ kind: fc.constant('file' as const), size: fc.oneof(fc.constant(0), fc.nat(5000)) }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('link' as const), target: name }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('hardlink' as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('dir' as const) }) },
);
const tree = fc.array(
  fc.record({ top: fc.constantFrom('workspace', 'home', 'envs'), dir: fc.option(name), name, node }),
  { minLength: 1, maxLength: 40 },
);
type Tree = typeof tree extends fc.Arbitrary<infer T> ? T : never;

/** Writes the tree; returns its regular files (relative paths). */
async function build(root: string, entries: Tree): Promise<string[]> {
  const files: string[] = [];
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
      files.push(path.relative(root, file));
    } else if (n.kind === 'link') await fs.symlink(n.target, file);
    else if (n.kind === 'hardlink' && files.length > 0) await fs.link(path.join(root, files[0]), file);
    else if (n.kind === 'dir') await fs.mkdir(file);
  }
  return files;
}

describe('re-suspend after a restore on another host', () => {
  test("unchanged: the top object alone; one file changed: its segment and pack; a change in the restore's clock tick is read again; every result restores byte for byte", async () => {
    await fc.assert(
      fc.asyncProperty(tree, fc.nat(), fc.nat(5000), async (entries, pick, size) => {
        const root = await newSandboxRoot();
        const files = await build(root, entries);
        const sandboxId = uniqueId('cas-rehost');
        const first = await take(store, root, sandboxId);
        puts.length = 0;

        // Another host: the files restored from the store alone, with new inodes and ctimes.
        const b = await restoreFresh(store, first.checkpoint);
        expect(await describeTree(b.target)).toEqual(await describeTree(root));
        const unchanged = await take(store, b.target, sandboxId, b.baseline);
        expect(written()).toEqual({ tops: 1, segments: 0, packs: 0, other: 0 });
        // Its stats are trusted: nothing is read (hardlinked files too, whose ctime the link changed).
        expect(unchanged.stats).toMatchObject({ filesHashed: 0, packs: 0, segments: 0 });
        expect(unchanged.baseline.manifest.segments).toEqual(first.baseline.manifest.segments);

        if (files.length > 0) {
          // One file changed (a new size, or the same size and mtime with other bytes).
          const changed = files[pick % files.length];
          await fs.writeFile(path.join(b.target, changed), bytes(size));
          const edited = await take(store, b.target, sandboxId, unchanged.baseline);
          expect(edited.stats.filesHashed).toBe(1);
          const counts = written();
          expect(counts).toMatchObject({ tops: 1, segments: 1, other: 0 });
          expect(counts.packs).toBe(size > 0 ? 1 : 0);
          const c = await restoreFresh(store, edited.checkpoint);
          expect(await describeTree(c.target)).toEqual(await describeTree(b.target));

          // Right after a restore, a file rewritten with bytes of its size and its mtime put back, in the
          // same clock tick as the restore's stat (so its ctime is the one recorded): read again all the same.
          const target = path.join(c.target, changed);
          const before = await fs.stat(target, { bigint: true });
          const other = bytes(size);
          if (size > 0) other[0] = (((await fs.readFile(target))[0] ?? 0) + 1) % 256;
          await fs.writeFile(target, other);
          // To the middle of its microsecond, as restore sets it (a double keeps about a quarter of one).
          const seconds =
            Number(before.mtimeNs / 1_000_000_000n) +
            (Number((before.mtimeNs % 1_000_000_000n) / 1000n) * 1000 + 500) / 1e9;
          await fs.utimes(target, seconds, seconds);
          const after = await fs.stat(target, { bigint: true });
          expect([after.size, storedMtime(after.mtimeNs)]).toEqual([before.size, storedMtime(before.mtimeNs)]);
          const sameTick: Baseline = {
            ...c.baseline,
            local: { ...c.baseline.local, [changed]: [after.ino.toString(), after.ctimeNs.toString()] },
          };
          puts.length = 0;
          const racy = await take(store, c.target, sandboxId, sameTick);
          expect(racy.stats.filesHashed).toBeGreaterThanOrEqual(size > 0 ? 1 : 0);
          const d = await restoreFresh(store, racy.checkpoint);
          expect(await fs.readFile(path.join(d.target, changed))).toEqual(other);
          expect(await describeTree(d.target)).toEqual(await describeTree(c.target));
        }
        puts.length = 0;
        await store.deletePrefix(`checkpoints/${sandboxId}/`);
      }),
      { numRuns: 15 },
    );
  });

  test('a checkpoint of the earlier stasis-cas-2 writer (ctimes in its segments, a zstd top object) restores; the next re-suspend rewrites its segments once, then the top alone', async () => {
    const root = await newSandboxRoot();
    for (let d = 0; d < 4; d += 1) {
      await fs.mkdir(path.join(root, 'workspace', `d${d}`));
      for (let i = 0; i < 60; i += 1)
        await fs.writeFile(path.join(root, 'workspace', `d${d}`, `f${i}`), bytes(100 + i));
    }
    await fs.symlink('d0/f1', path.join(root, 'workspace', 'link'));
    await fs.link(path.join(root, 'workspace', 'd1', 'f2'), path.join(root, 'home', 'hard'));
    const sandboxId = uniqueId('cas-old2');
    const prefix = `checkpoints/${sandboxId}/`;
    const taken = await take(store, root, sandboxId);
    const old = await writeAsEarlierCas2(prefix, taken.baseline.manifest);
    expect(old.uri.endsWith(ZSTD_MANIFEST_SUFFIX)).toBe(true);
    puts.length = 0;
    const restored = await restoreFresh(store, old);
    expect(restored.labels).toEqual({ run: 'r1' });
    expect(await describeTree(restored.target)).toEqual(await describeTree(root));
    const next = await take(store, restored.target, sandboxId, restored.baseline);
    expect(next.stats).toMatchObject({ filesHashed: 0, packs: 0 });
    expect(next.checkpoint.uri.endsWith(MANIFEST_SUFFIX)).toBe(true);
    puts.length = 0;
    await take(store, restored.target, sandboxId, next.baseline);
    expect(written()).toEqual({ tops: 1, segments: 0, packs: 0, other: 0 });
    expect(await describeTree((await restoreFresh(store, next.checkpoint)).target)).toEqual(await describeTree(root));
    await store.deletePrefix(prefix);
  });
});

describe("a restore's racy window", () => {
  test('its baseline time is past every ctime it recorded by the margin; a filesystem clock far ahead is not waited for, its files stay racy', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.integer({ min: -5_000, max: 40 }), { maxLength: 5 }), async (offsetsMs) => {
        const now = nowNs();
        const local = Object.fromEntries(
          offsetsMs.map((ms, i) => [`f${i}`, ['1', (now + BigInt(ms) * 1_000_000n).toString()] as [string, string]]),
        );
        const takenAt = await pastRacyWindow(local, undefined);
        // Not racy by unchangedChunks' rule: ctime + margin < the baseline's time.
        for (const [, ctime] of Object.values(local)) expect(BigInt(ctime) + RACY_MARGIN_NS).toBeLessThan(takenAt);
      }),
      { numRuns: 10 },
    );
    // A ctime an hour ahead (a filesystem whose clock is): the baseline's time is not moved past it, so it stays racy.
    const ahead = nowNs() + 3_600_000_000_000n;
    const takenAt = await pastRacyWindow({ f: ['1', ahead.toString()] }, undefined);
    expect(ahead + RACY_MARGIN_NS).toBeGreaterThanOrEqual(takenAt);
  });
});

describe('segments reused from the baseline without serialising them', () => {
  test('are the segments a full split makes, through random edits; each checkpoint restores byte for byte', async () => {
    const edit = fc.record({
      kind: fc.constantFrom('write', 'add', 'remove', 'chmod', 'touch', 'mkdir'),
      at: fc.nat(),
      size: fc.nat(3000),
    });
    await fc.assert(
      fc.asyncProperty(fc.array(edit, { minLength: 1, maxLength: 6 }), async (edits) => {
        const root = await newSandboxRoot();
        const files: string[] = [];
        for (let d = 0; d < 8; d += 1) {
          await fs.mkdir(path.join(root, 'workspace', `p${d}`));
          for (let i = 0; i < 90; i += 1) {
            files.push(path.join('workspace', `p${d}`, `f${i}.js`));
            await fs.writeFile(path.join(root, files.at(-1)!), bytes(i % 7));
          }
        }
        const sandboxId = uniqueId('cas-reuse');
        let taken = await take(store, root, sandboxId);
        expect(taken.baseline.manifest.segments!.length).toBeGreaterThan(1);
        for (const [n, e] of edits.entries()) {
          const file = files[e.at % files.length];
          const full = path.join(root, file);
          const exists = await fs.lstat(full).then(
            () => true,
            () => false,
          );
          if (e.kind === 'write' && exists) await fs.writeFile(full, bytes(e.size));
          if (e.kind === 'add') await fs.writeFile(`${full}.new${n}`, bytes(e.size));
          if (e.kind === 'remove' && exists) await fs.rm(full);
          if (e.kind === 'chmod' && exists) await fs.chmod(full, 0o600);
          if (e.kind === 'touch' && exists) await fs.utimes(full, 1_600_000_000 + n, 1_600_000_000 + n);
          if (e.kind === 'mkdir') await fs.mkdir(path.join(path.dirname(full), `d${n}`), { recursive: true });
          const next = await take(store, root, sandboxId, taken.baseline);
          // The refs the fast path took are those serialising every segment gives (stored bytes aside).
          const slow = splitManifest(next.baseline.manifest).segments.map(({ ref }) => [ref[0], ref[2], ref[3]]);
          expect(next.baseline.manifest.segments!.map((ref) => [ref[0], ref[2], ref[3]])).toEqual(slow);
          expect(await describeTree((await restoreFresh(store, next.checkpoint)).target)).toEqual(
            await describeTree(root),
          );
          taken = next;
        }
        puts.length = 0;
        await store.deletePrefix(`checkpoints/${sandboxId}/`);
      }),
      { numRuns: 6 },
    );
  });
});

/**
 * `manifest` stored as the stasis-cas-2 writer before this one stored it (encoded here, not by the code
 * under test): entries with a ctime and an mtime to the nanosecond, segments of 50 entries, a zstd top.
 */
async function writeAsEarlierCas2(prefix: string, manifest: Manifest) {
  const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
  const packNames = manifest.packs.map((pack) => /([0-9a-f]{64})\.pack$/.exec(pack.uri)![1]);
  const segments: [string, number, number, number][] = [];
  for (let from = 0; from < manifest.entries.length; from += 50) {
    const entries = manifest.entries.slice(from, from + 50).map((entry) => ({
      p: entry.p,
      k: entry.k,
      m: entry.m,
      s: entry.s,
      mt: (BigInt(entry.mt) + 123n).toString(),
      ct: '1700000000123456789',
      ...(entry.l !== undefined ? { l: entry.l } : {}),
      ...(entry.c !== undefined ? { c: entry.c } : {}),
    }));
    const chunks: Record<string, [number, number, number]> = {};
    for (const entry of entries) for (const hash of entry.c ?? []) chunks[hash] = manifest.chunks[hash];
    const json = Buffer.from(JSON.stringify({ format: 'stasis-cas-2-segment', packs: packNames, chunks, entries }));
    const stored = deflateRawSync(json);
    await inner.put(`${prefix}${SEGMENTS_DIR}${sha256(json)}${SEGMENT_SUFFIX}`, Readable.from([stored]), {});
    segments.push([sha256(json), stored.length, json.length, entries.length]);
  }
  const top = { format: 'stasis-cas-2', takenAtNs: manifest.takenAtNs, segments, packs: manifest.packs };
  const body = await zstdCompress(Buffer.from(JSON.stringify(top)));
  return inner.put(`${prefix}old${ZSTD_MANIFEST_SUFFIX}`, Readable.from([body]), { run: 'r1' });
}
