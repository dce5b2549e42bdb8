import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { gunzipSync } from 'node:zlib';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { TopManifest } from '../../stores/cas/manifest';
import { restoreCheckpoint, restoreStages } from '../../stores/cas/restore';
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
  failing.download = async (checkpoint, file, signal) => {
    const times = (asked.get(checkpoint.uri) ?? 0) + 1;
    asked.set(checkpoint.uri, times);
    if (source.packs.includes(checkpoint.uri) && times === 2) throw broken;
    return store.download(checkpoint, file, signal);
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
