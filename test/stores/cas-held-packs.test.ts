import { createHash } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import { StasisError } from '../../common/errors';
import type { Checkpoint } from '../../common/schemas';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import {
  encodeManifest,
  PACK_SUFFIX,
  PACKS_DIR,
  TopManifest,
  ZSTD_MANIFEST_SUFFIX,
  type Manifest,
} from '../../stores/cas/manifest';
import { restoreCheckpoint, restoreStages } from '../../stores/cas/restore';
import { zstdRawFrame } from '../../stores/cas/zstd';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree, newSandboxRoot, take } from './cas-helpers';

// Memory of a restore whose files share chunks far apart: a sandbox that copied a tree (`cp -r a z`)
// checkpoints the copy's chunks once, in the packs of the original. A pack the copy needs again
// must not stay decompressed in memory from the original's files to the copy's: with every pack
// held so, a restore held the whole checkpoint decompressed (here 12 × 8 MiB; a 10 GiB workspace
// and its copy: 10 GiB). Counted through the restore's stage marks (decompressed → dropped).

const store = s3StoreFromEnv(5 * 1024 * 1024);

/** Packs held decompressed at once (restore.ts PACKS_AHEAD), and the one the writer needs beyond them. */
const HELD_AT_MOST = 6 + 1;

/** A checkpoint of `count` random files of 8 MiB in a/ and their copies in z/. */
async function treeAndCopy(count: number) {
  const root = await newSandboxRoot();
  for (const dir of ['a', 'z']) await fs.mkdir(path.join(root, 'workspace', dir));
  for (let i = 0; i < count; i++) {
    const blob = bytes(8 * 1024 * 1024);
    await fs.writeFile(path.join(root, 'workspace', 'a', `blob-${i}.bin`), blob);
    await fs.writeFile(path.join(root, 'workspace', 'z', `blob-${i}.bin`), blob);
  }
  const { checkpoint } = await take(store, root, uniqueId('cas-held'));
  const top = TopManifest.parse(JSON.parse(gunzipSync(await store.read(checkpoint.uri, 1 << 20)).toString()));
  return { root, checkpoint, packs: top.packs.map((pack) => pack.uri) };
}

let source: Awaited<ReturnType<typeof treeAndCopy>>;
beforeAll(async () => {
  source = await treeAndCopy(12);
}, 120_000);

test('a tree and its copy: no more packs held decompressed at once than the window, and the files restore byte for byte', async () => {
  const { root, checkpoint, packs } = source;
  expect(packs.length).toBeGreaterThan(HELD_AT_MOST + 2);

  const held = new Set<string>();
  let most = 0;
  let decompressed = 0;
  const onStage = (message: unknown) => {
    const { stage } = message as { stage: string };
    const verified = /^pack (\d+) decompressed and verified$/.exec(stage);
    const dropped = /^pack (\d+) dropped$/.exec(stage);
    if (verified) {
      decompressed += 1;
      held.add(verified[1]);
    }
    if (dropped) held.delete(dropped[1]);
    most = Math.max(most, held.size);
  };
  const dir = await tempDir('cas-held');
  const target = path.join(dir, 'target');
  const tempPrefix = path.join(dir, 'download');
  await fs.mkdir(target);
  restoreStages.subscribe(onStage);
  try {
    await restoreCheckpoint({
      store,
      checkpoint,
      targetDir: target,
      tempPrefix,
      limits: DEFAULT_ARCHIVE_LIMITS,
      progress: { bytes: 0 },
    });
  } finally {
    restoreStages.unsubscribe(onStage);
  }
  expect(await describeTree(target)).toEqual(await describeTree(root));
  // Every pack was decompressed (some twice: dropped between the original's files and the copy's), and let go by the end.
  expect(decompressed).toBeGreaterThanOrEqual(packs.length);
  expect(held.size).toBe(0);
  expect(most).toBeLessThanOrEqual(HELD_AT_MOST);
  expect((await fs.readdir(dir)).sort()).toEqual(['target']);
}, 300_000);

test('a pack downloaded again (dropped, needed again by the copy) that fails: that error, and no download left', async () => {
  const asked = new Map<string, number>();
  const broken = new Error('store down: injected');
  const failing = Object.create(store) as CheckpointStore;
  failing.download = async (checkpoint, file, signal, verify) => {
    const times = (asked.get(checkpoint.uri) ?? 0) + 1;
    asked.set(checkpoint.uri, times);
    if (source.packs.includes(checkpoint.uri) && times === 2) throw broken;
    return store.download(checkpoint, file, signal, verify);
  };
  const dir = await tempDir('cas-held');
  const target = path.join(dir, 'target');
  await fs.mkdir(target);
  const outcome = await restoreCheckpoint({
    store: failing,
    checkpoint: source.checkpoint,
    targetDir: target,
    tempPrefix: path.join(dir, 'download'),
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { bytes: 0 },
  }).catch((err: unknown) => err);
  expect([...asked.values()]).toContain(2);
  expect(outcome).toBe(broken);
  expect((await fs.readdir(dir)).sort()).toEqual(['target']);
}, 300_000);

/**
 * A crafted checkpoint (a sandbox can make such a file of chunks it already has): PACKS packs of 16
 * chunks, and one file reading chunk j of pack 0, 1, ... PACKS - 1, then chunk j + 1 of each. With
 * `corruptLast`, a second file after it reads 4 KiB of pack 0 under a name those bytes do not hash to.
 */
async function cycleCheckpoint(corruptLast: boolean) {
  const prefix = `checkpoints/${uniqueId('cas-cycle')}/`;
  const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
  const PACKS = 20;
  const CHUNKS = 16;
  const chunks: Manifest['chunks'] = {};
  const packs: Manifest['packs'] = [];
  const order: string[][] = [];
  const parts: Buffer[][] = [];
  for (let p = 0; p < PACKS; p++) {
    const data = Array.from({ length: CHUNKS }, () => bytes(4096));
    const plain = Buffer.concat(data);
    data.forEach((chunk, j) => (chunks[sha256(chunk)] = [p, j * 4096, 4096]));
    order.push(data.map(sha256));
    parts.push(data);
    const stored = await store.put(
      `${prefix}${PACKS_DIR}${sha256(plain)}${PACK_SUFFIX}`,
      Readable.from(zstdRawFrame([plain], plain.length)),
      {},
    );
    packs.push({ ...stored, size: plain.length });
  }
  const c: string[] = [];
  const content: Buffer[] = [];
  for (let j = 0; j < CHUNKS; j++) {
    for (let p = 0; p < PACKS; p++) {
      c.push(order[p][j]);
      content.push(parts[p][j]);
    }
  }
  const ns = '1700000000000000000';
  const entries: Manifest['entries'] = [
    { p: 'workspace', k: 'd', m: 0o755, s: 0, mt: ns, ct: ns },
    { p: 'workspace/cycle.bin', k: 'f', m: 0o644, s: PACKS * CHUNKS * 4096, mt: ns, ct: ns, c },
  ];
  const forged = sha256(Buffer.from('not these bytes'));
  if (corruptLast) {
    chunks[forged] = [0, 4096, 4096];
    entries.push({ p: 'workspace/z-forged.bin', k: 'f', m: 0o644, s: 4096, mt: ns, ct: ns, c: [forged] });
  }
  const manifest: Manifest = { format: 'stasis-cas-1', takenAtNs: ns, entries, chunks, packs };
  const checkpoint = await store.put(
    `${prefix}${uniqueId('m')}${ZSTD_MANIFEST_SUFFIX}`,
    Readable.from([await encodeManifest(manifest)]),
    { run: 'r1' },
  );
  return { checkpoint, packs, content: Buffer.concat(content), forged };
}

/** Restores `checkpoint` into a new directory, counting downloads by pack and packs held in memory (stage marks). */
async function restoreCounting(checkpoint: Checkpoint) {
  const asked = new Map<string, number>();
  const counting = Object.create(store) as CheckpointStore;
  counting.download = async (ref, file, signal, verify) => {
    asked.set(ref.uri, (asked.get(ref.uri) ?? 0) + 1);
    return store.download(ref, file, signal, verify);
  };
  const held = new Set<string>();
  const marks = { most: 0, spilled: 0 };
  const onStage = (message: unknown) => {
    const { stage } = message as { stage: string };
    const [, pack, what] = /^pack (\d+) (decompressed and verified|dropped|spilled)$/.exec(stage) ?? [];
    if (what === 'decompressed and verified') held.add(pack);
    else if (what) held.delete(pack);
    if (what === 'spilled') marks.spilled += 1;
    marks.most = Math.max(marks.most, held.size);
  };
  const dir = await tempDir('cas-cycle');
  const target = path.join(dir, 'target');
  await fs.mkdir(target);
  restoreStages.subscribe(onStage);
  try {
    const outcome = await restoreCheckpoint({
      store: counting,
      checkpoint,
      targetDir: target,
      tempPrefix: path.join(dir, 'download'),
      limits: DEFAULT_ARCHIVE_LIMITS,
      progress: { bytes: 0 },
    }).catch((err: unknown) => err);
    return { outcome, asked, marks, dir, target };
  } finally {
    restoreStages.unsubscribe(onStage);
  }
}

test('a file whose chunks cycle through more packs than are held: each pack downloaded at most twice, no more packs in memory than the window, the file restores byte for byte', async () => {
  // Dropping the pack needed farthest from now would download a pack again for nearly every chunk (8 MiB
  // packs for 64 KiB chunks); holding every pack dropped once to its last use held them all in memory (a
  // sandbox's crafted file could so fill the worker's memory): dropped twice, a pack is spilled to disk.
  const { checkpoint, packs, content } = await cycleCheckpoint(false);
  const { outcome, asked, marks, dir, target } = await restoreCounting(checkpoint);
  expect(outcome).not.toBeInstanceOf(Error);
  expect(await fs.readFile(path.join(target, 'workspace', 'cycle.bin'))).toEqual(content);
  const downloads = packs.map((pack) => asked.get(pack.uri) ?? 0);
  expect(Math.min(...downloads)).toBeGreaterThanOrEqual(1);
  expect(Math.max(...downloads)).toBeLessThanOrEqual(2);
  expect(marks.most).toBeLessThanOrEqual(HELD_AT_MOST);
  expect(marks.spilled).toBeGreaterThan(0);
  expect((await fs.readdir(dir)).sort()).toEqual(['target']);
}, 300_000);

test('a corrupt chunk read after packs were spilled: CHECKPOINT_INVALID naming it, and no spilled file left', async () => {
  const { checkpoint, forged } = await cycleCheckpoint(true);
  const { outcome, marks, dir } = await restoreCounting(checkpoint);
  expect(marks.spilled).toBeGreaterThan(0);
  expect(outcome).toBeInstanceOf(StasisError);
  expect((outcome as StasisError).code).toBe('CHECKPOINT_INVALID');
  expect((outcome as StasisError).message).toContain(forged);
  expect((outcome as StasisError).message).toContain('workspace/z-forged.bin');
  expect((await fs.readdir(dir)).sort()).toEqual(['target']);
}, 300_000);
