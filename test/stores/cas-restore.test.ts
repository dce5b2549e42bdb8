import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { gunzipSync } from 'node:zlib';
import { StasisError } from '../../common/errors';
import type { Checkpoint } from '../../common/schemas';
import { createLocalProvider } from '../../providers/local';
import { sandboxPaths } from '../../providers/sandbox-state';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { encodeTop, TopManifest } from '../../stores/cas/manifest';
import { restoreCheckpointFiles } from '../../stores/cas/restore';
import { context, mountsUnder, s3StoreFromEnv, stasisError, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree, newSandboxRoot, take } from './cas-helpers';

// The overlaps of a cross-host restore (issue 16), attacked between their stages against a real
// MinIO: the first packs download while the manifest is read and the target (the sandbox's
// volume) is made; nothing is written before the target is ready, nothing downloaded outlives the
// restore, whatever fails first; a pack the top object names outside its sandbox is never fetched.
// Faults come from a store that passes every call to MinIO and fails or holds the ones chosen.

const store = s3StoreFromEnv(5 * 1024 * 1024);

interface Call {
  kind: 'download' | 'read';
  uri: string;
}

/** MinIO, with every call recorded, held until `gate` settles when `hold` says so, and failed when `fail` says so. */
function faulty(options: {
  calls: Call[];
  fail?: (call: Call, index: number) => Error | undefined;
  hold?: (call: Call) => Promise<unknown> | undefined;
}): CheckpointStore {
  const wrapped = Object.create(store) as CheckpointStore;
  const around = async <T>(call: Call, run: () => Promise<T>): Promise<T> => {
    const index = options.calls.push(call) - 1;
    await options.hold?.(call);
    const error = options.fail?.(call, index);
    if (error) throw error;
    return run();
  };
  wrapped.download = (checkpoint, file, signal, verify) =>
    around({ kind: 'download', uri: checkpoint.uri }, () => store.download(checkpoint, file, signal, verify));
  wrapped.read = (uri, maxBytes, signal) => around({ kind: 'read', uri }, () => store.read(uri, maxBytes, signal));
  return wrapped;
}

const isPack = (call: Call) => call.uri.includes('/packs/');

/** A checkpoint of a few packs (three files of 7 MiB that do not compress, and text) and a thousand small files in several segments (about 470 entries a segment). */
async function threePacks() {
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('cas-restore');
  for (let i = 0; i < 3; i++) await fs.writeFile(path.join(root, 'workspace', `blob-${i}.bin`), bytes(7 * 1024 * 1024));
  for (let d = 0; d < 10; d++) {
    const dir = path.join(root, 'workspace', 'src', `d${d}`);
    await fs.mkdir(dir, { recursive: true });
    for (let f = 0; f < 100; f++)
      await fs.writeFile(path.join(dir, `f${f}.txt`), `file ${d}/${f}\n`.repeat((f % 30) + 1));
  }
  await fs.symlink('src/d0/f0.txt', path.join(root, 'workspace', 'link'));
  const { checkpoint } = await take(store, root, sandboxId);
  const top = TopManifest.parse(JSON.parse(gunzipSync(await store.read(checkpoint.uri, 1 << 20)).toString()));
  // The tests below fail a segment after the first: there must be more than one.
  expect(top.segments.length).toBeGreaterThanOrEqual(2);
  return { root, sandboxId, checkpoint, packs: top.packs.length, tree: await describeTree(root) };
}

let source: Awaited<ReturnType<typeof threePacks>>;
beforeAll(async () => {
  source = await threePacks();
}, 120_000);

/** What is left of a restore's downloads beside `tempPrefix`. */
async function leftovers(tempPrefix: string): Promise<string[]> {
  const names = await fs.readdir(path.dirname(tempPrefix));
  return names.filter((name) => name.startsWith(path.basename(tempPrefix)));
}

/**
 * Restores `checkpoint` from `storeUsed` into a new directory; the target is ready when `ready`
 * (given the target's path) settles.
 */
async function restoreWith(
  storeUsed: CheckpointStore,
  checkpoint: Checkpoint,
  ready: (target: string) => Promise<unknown>,
) {
  const dir = await tempDir('cas-restore');
  const target = path.join(dir, 'target');
  await fs.mkdir(target);
  const tempPrefix = path.join(dir, 'download');
  const outcome = await restoreCheckpointFiles({
    store: storeUsed,
    checkpoint,
    targetDir: target,
    tempPrefix,
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { bytes: 0 },
    targetReady: ready(target),
  }).then(
    async (restored) => ({ restored, baseline: await restored.baseline }),
    (err: unknown) => ({ err }),
  );
  return { dir, target, tempPrefix, outcome };
}

async function until(what: () => boolean): Promise<void> {
  while (!what()) await new Promise((resolve) => setTimeout(resolve, 5));
}

describe('packs fetched while the manifest is read and the target made', () => {
  test('the first packs download before the segments are in and before the target is ready; nothing is written before; the files restore byte for byte', async () => {
    const calls: Call[] = [];
    let releaseSegments!: () => void;
    const segmentsHeld = new Promise<void>((resolve) => (releaseSegments = resolve));
    // Segments are held until a pack download has begun: only a pack fetched early lets the restore go on.
    const held = faulty({ calls, hold: (call) => (call.uri.includes('/segments/') ? segmentsHeld : undefined) });
    let inTargetWhenReady: string[] | undefined;
    const { target, tempPrefix, outcome } = await restoreWith(held, source.checkpoint, async (dir) => {
      await until(() => calls.some(isPack));
      releaseSegments();
      // Every pack (fewer than the sixteen fetched ahead) is asked for before the target is ready, and nothing is in it yet.
      await until(() => calls.filter(isPack).length >= source.packs);
      inTargetWhenReady = await fs.readdir(dir);
    });
    if ('err' in outcome) throw outcome.err;
    expect(inTargetWhenReady).toEqual([]);
    expect(source.packs).toBeGreaterThanOrEqual(3);
    expect(source.packs).toBeLessThanOrEqual(6);
    // Each once: the ones fetched early are the ones the reader uses.
    expect(new Set(calls.filter(isPack).map((call) => call.uri)).size).toBe(source.packs);
    expect(calls.filter(isPack)).toHaveLength(source.packs);
    expect(await describeTree(target)).toEqual(source.tree);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 120_000);

  test('a target that fails while packs download ends the restore with its error: nothing written, no download left', async () => {
    const calls: Call[] = [];
    const broken = new Error('mkfs.ext4 failed: injected');
    const { target, tempPrefix, outcome } = await restoreWith(faulty({ calls }), source.checkpoint, async () => {
      await until(() => calls.some(isPack));
      throw broken;
    });
    expect('err' in outcome && outcome.err).toBe(broken);
    expect(await fs.readdir(target)).toEqual([]);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 120_000);

  test('a segment missing while the first packs download is CHECKPOINT_INVALID naming it; no download left, nothing written', async () => {
    const calls: Call[] = [];
    const missing = faulty({
      calls,
      fail: (call) =>
        call.uri.includes('/segments/') && calls.filter((c) => c.uri.includes('/segments/'))[1]?.uri === call.uri
          ? new StasisError('NOT_FOUND', `no object ${call.uri}`)
          : undefined,
    });
    let targetMade = false;
    const { target, tempPrefix, outcome } = await restoreWith(missing, source.checkpoint, async () => {
      targetMade = true;
    });
    expect('err' in outcome).toBe(true);
    const err = (outcome as { err: unknown }).err;
    expect(err).toBeInstanceOf(StasisError);
    expect((err as StasisError).code).toBe('CHECKPOINT_INVALID');
    expect((err as StasisError).message).toMatch(/needs segment .*\/segments\/[0-9a-f]{64}\.seg, which is missing/);
    expect(targetMade).toBe(true); // made at once; the manifest failed, so nothing went into it
    expect(await fs.readdir(target)).toEqual([]);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 120_000);

  test('a restore failing while its pack downloads hang cancels them: it reports its error at once, with no download left', async () => {
    const calls: Call[] = [];
    const started: { settled: boolean }[] = [];
    const hanging = faulty({
      calls,
      fail: (call) =>
        call.uri.includes('/segments/') && calls.filter((c) => c.uri.includes('/segments/'))[1]?.uri === call.uri
          ? new StasisError('NOT_FOUND', `no object ${call.uri}`)
          : undefined,
    });
    // A pack download that never ends unless cancelled (a store that stopped answering).
    hanging.download = (checkpoint, file, signal, verify) => {
      if (!isPack({ kind: 'download', uri: checkpoint.uri })) return store.download(checkpoint, file, signal, verify);
      calls.push({ kind: 'download', uri: checkpoint.uri });
      const download = { settled: false };
      started.push(download);
      return new Promise((_resolve, reject) => {
        const cancelled = () => {
          download.settled = true;
          reject(signal!.reason instanceof Error ? signal!.reason : new Error('aborted'));
        };
        // As the SDK does: a request made with a signal already aborted fails at once.
        if (signal?.aborted) cancelled();
        else signal?.addEventListener('abort', cancelled, { once: true });
      });
    };
    const { target, tempPrefix, outcome } = await restoreWith(hanging, source.checkpoint, async () => undefined);
    expect('err' in outcome).toBe(true);
    const err = (outcome as { err: unknown }).err as StasisError;
    expect(err.code).toBe('CHECKPOINT_INVALID');
    expect(err.message).toMatch(/needs segment .*, which is missing/);
    // Downloads were under way (the test hung them), and each was cancelled.
    expect(started.length).toBeGreaterThan(0);
    expect(started.every((download) => download.settled)).toBe(true);
    expect(await fs.readdir(target)).toEqual([]);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 60_000);

  test('a top object naming a pack outside its sandbox is CHECKPOINT_INVALID, and that pack is never fetched', async () => {
    const top = TopManifest.parse(JSON.parse(gunzipSync(await store.read(source.checkpoint.uri, 1 << 20)).toString()));
    const other = await threePacks();
    const otherTop = TopManifest.parse(
      JSON.parse(gunzipSync(await store.read(other.checkpoint.uri, 1 << 20)).toString()),
    );
    // Another sandbox's pack, listed first (the segments find theirs by name): only its place gives it away.
    const foreign = otherTop.packs[0];
    const crafted = { ...top, packs: [foreign, ...top.packs] };
    const key = `checkpoints/${source.sandboxId}/${uniqueId('crafted')}.manifest.gz`;
    const checkpoint = await store.putBytes(key, encodeTop(crafted), {});
    const calls: Call[] = [];
    const { target, tempPrefix, outcome } = await restoreWith(faulty({ calls }), checkpoint, async () => undefined);
    expect('err' in outcome).toBe(true);
    const err = (outcome as { err: unknown }).err as StasisError;
    expect(err.code).toBe('CHECKPOINT_INVALID');
    expect(err.message).toContain(foreign.uri);
    expect(calls.map((c) => c.uri)).not.toContain(foreign.uri);
    expect(await fs.readdir(target)).toEqual([]);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 180_000);

  test('property: a store call failing and the target failing or coming late, at random points; the restore is whole or fails, and leaves no download', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.option(fc.nat(12), { nil: undefined }),
        fc.constantFrom('missing', 'down'),
        fc.option(fc.nat(4), { nil: undefined }),
        fc.nat(4),
        async (failAt, how, targetFailsAfterPacks, targetAfterPacks) => {
          const calls: Call[] = [];
          const chaos = faulty({
            calls,
            fail: (call, index) =>
              index === failAt
                ? how === 'missing'
                  ? new StasisError('NOT_FOUND', `no object ${call.uri}`)
                  : new Error('connect ECONNREFUSED (injected)')
                : undefined,
          });
          const targetError = new Error('volume failed (injected)');
          const { target, tempPrefix, outcome } = await restoreWith(chaos, source.checkpoint, async () => {
            const after = targetFailsAfterPacks ?? targetAfterPacks;
            // Waits for that many pack requests, or for the restore to have stopped asking (a failure).
            const start = Date.now();
            await until(() => calls.filter(isPack).length >= after || Date.now() - start > 2_000);
            if (targetFailsAfterPacks !== undefined) throw targetError;
          });
          expect(await leftovers(tempPrefix)).toEqual([]);
          const failed = failAt !== undefined && failAt < calls.length;
          if (!('err' in outcome)) {
            expect(failed).toBe(false);
            expect(targetFailsAfterPacks).toBeUndefined();
            expect(await describeTree(target)).toEqual(source.tree);
            return;
          }
          const err = outcome.err;
          if (err === targetError) {
            expect(await fs.readdir(target)).toEqual([]);
            return;
          }
          expect(failed).toBe(true);
          const call = calls[failAt as number];
          if (how === 'down') expect((err as Error).message).toContain('injected');
          else if (call.uri === source.checkpoint.uri) expect((err as StasisError).code).toBe('NOT_FOUND');
          else {
            // A missing segment or pack is the checkpoint's fault, and named.
            expect((err as StasisError).code).toBe('CHECKPOINT_INVALID');
            expect((err as StasisError).message).toContain(call.uri);
          }
        },
      ),
      { numRuns: 12 },
    );
  }, 300_000);
});

describe('packs downloaded ahead of the packs held decompressed', () => {
  // More packs than are held decompressed at once (six): the later ones download while the writer waits.
  let many: Awaited<ReturnType<typeof manyPacks>>;
  async function manyPacks() {
    const root = await newSandboxRoot();
    for (let i = 0; i < 9; i++)
      await fs.writeFile(path.join(root, 'workspace', `blob-${i}.bin`), bytes(8 * 1024 * 1024));
    const { checkpoint } = await take(store, root, uniqueId('cas-restore-many'));
    const top = TopManifest.parse(JSON.parse(gunzipSync(await store.read(checkpoint.uri, 1 << 20)).toString()));
    return { checkpoint, packs: top.packs.map((pack) => pack.uri), tree: await describeTree(root) };
  }
  beforeAll(async () => {
    many = await manyPacks();
  }, 180_000);

  /** Waits until `what`, or `ms` passed; says which. */
  async function within(what: () => boolean, ms: number): Promise<boolean> {
    const start = Date.now();
    await until(() => what() || Date.now() - start > ms);
    return what();
  }

  test('with the target not ready (nothing written, nothing held decompressed is used), every pack is asked for; the files restore byte for byte', async () => {
    const calls: Call[] = [];
    let allAsked = false;
    const { target, tempPrefix, outcome } = await restoreWith(faulty({ calls }), many.checkpoint, async () => {
      allAsked = await within(() => calls.filter(isPack).length >= many.packs.length, 20_000);
    });
    if ('err' in outcome) throw outcome.err;
    expect(many.packs.length).toBeGreaterThan(6);
    expect(allAsked).toBe(true);
    // Each once: fetched ahead, used later.
    expect(
      calls
        .filter(isPack)
        .map((call) => call.uri)
        .sort(),
    ).toEqual([...many.packs].sort());
    expect(await describeTree(target)).toEqual(many.tree);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 120_000);

  test('a target that fails once every pack was downloaded ahead: its error, nothing written, no download left', async () => {
    const calls: Call[] = [];
    let downloaded = 0;
    const counting = faulty({ calls });
    const download = counting.download.bind(counting);
    counting.download = async (checkpoint, file, signal, verify) => {
      const value = await download(checkpoint, file, signal, verify);
      if (checkpoint.uri.includes('/packs/')) downloaded += 1;
      return value;
    };
    const broken = new Error('mkfs.ext4 failed: injected');
    const { target, tempPrefix, outcome } = await restoreWith(counting, many.checkpoint, async () => {
      expect(await within(() => downloaded >= many.packs.length, 30_000)).toBe(true);
      throw broken;
    });
    expect('err' in outcome && outcome.err).toBe(broken);
    expect(await fs.readdir(target)).toEqual([]);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 120_000);

  test('the last pack missing, found while the first are written: CHECKPOINT_INVALID naming it, no download left', async () => {
    const last = many.packs[many.packs.length - 1];
    const calls: Call[] = [];
    const missing = faulty({
      calls,
      fail: (call) => (call.uri === last ? new StasisError('NOT_FOUND', `no object ${call.uri}`) : undefined),
    });
    const { tempPrefix, outcome } = await restoreWith(missing, many.checkpoint, async () => undefined);
    expect('err' in outcome).toBe(true);
    const err = (outcome as { err: unknown }).err;
    expect(err).toBeInstanceOf(StasisError);
    expect((err as StasisError).code).toBe('CHECKPOINT_INVALID');
    expect((err as StasisError).message).toContain(`needs pack ${last}, which is missing`);
    expect(await leftovers(tempPrefix)).toEqual([]);
  }, 120_000);
});

describe('a cross-host restore whose volume is made while it downloads', () => {
  const make = async () => {
    const dataDir = await tempDir('cas-restore-host');
    const hostId = uniqueId('host');
    const provider = createLocalProvider({ hostId, dataDir, store, volumes: 'required' });
    return { dataDir, hostId, provider };
  };

  test('a volume that cannot be made fails the restore once its downloads are done: no mount, no download, no staging left', async () => {
    const { dataDir, hostId, provider } = await make();
    const sandboxId = uniqueId('vol-fails');
    const paths = sandboxPaths(dataDir, sandboxId);
    // A leftover the volume's creation cannot remove (a directory where its image is made).
    await fs.mkdir(path.join(`${paths.volumeImage}.new`, 'stuck'), { recursive: true });
    const err = await provider
      .restore({ sandboxId, fence: 2, checkpoint: source.checkpoint }, context({ hostId, ownerId: sandboxId }))
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(String(err)).toMatch(/directory|EISDIR/i);
    // The obstacle stays (removing the sandbox trips on it too, before its other directories); no download or staging does.
    const left = await fs.readdir(paths.root);
    expect(left).toContain('volume.img.new');
    expect(left.filter((name) => name.startsWith('.restore-') || name === 'volume' || name === 'volume.img')).toEqual(
      [],
    );
    expect(mountsUnder(dataDir)).toEqual([]);
  }, 120_000);

  test('a volume too small for the checkpoint (ENOSPC while writing, the volume made during the downloads): no sandbox left, no mount', async () => {
    const { dataDir, hostId, provider } = await make();
    const sandboxId = uniqueId('vol-full');
    const err = await provider
      .restore(
        { sandboxId, fence: 2, checkpoint: source.checkpoint, limits: { diskMiB: 16 } },
        context({ hostId, ownerId: sandboxId }),
      )
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(String(err)).toMatch(/ENOSPC|no space/i);
    expect(await fs.stat(sandboxPaths(dataDir, sandboxId).root).catch(() => undefined)).toBeUndefined();
    expect(mountsUnder(dataDir)).toEqual([]);
  }, 120_000);

  test('a pack missing from the store while the volume is made is CHECKPOINT_INVALID naming it: no sandbox left, no mount', async () => {
    const { dataDir, hostId, provider } = await make();
    const other = await threePacks();
    const top = TopManifest.parse(JSON.parse(gunzipSync(await store.read(other.checkpoint.uri, 1 << 20)).toString()));
    const gone = top.packs[top.packs.length - 1].uri;
    await store.delete(gone);
    const sandboxId = other.sandboxId;
    const err = await stasisError(
      provider.restore({ sandboxId, fence: 2, checkpoint: other.checkpoint }, context({ hostId, ownerId: sandboxId })),
      'CHECKPOINT_INVALID',
    );
    expect(err.message).toContain(gone);
    expect(await fs.stat(sandboxPaths(dataDir, sandboxId).root).catch(() => undefined)).toBeUndefined();
    expect(mountsUnder(dataDir)).toEqual([]);
  }, 120_000);

  test('a restore then an unchanged release: the baseline written after the answer is there for the release, which uploads only its top object', async () => {
    const { dataDir, hostId, provider } = await make();
    const sandboxId = source.sandboxId;
    const ctx = context({ hostId, ownerId: sandboxId });
    await provider.restore({ sandboxId, fence: 2, checkpoint: source.checkpoint }, ctx);
    const calls: string[] = [];
    const counting = Object.create(store) as CheckpointStore;
    counting.putBytes = (key, body, labels, signal) => {
      calls.push(key);
      return store.putBytes(key, body, labels, signal);
    };
    // The same host's provider (another object: it finds the baseline on the disk, the settle of the first has run by then under the sandbox's lock).
    const again = createLocalProvider({ hostId, dataDir, store: counting, volumes: 'required' });
    const released = await again.release(
      { sandboxId, fence: 2, idempotencyKey: uniqueId('k'), mode: 'SNAPSHOT_AND_TERMINATE', reason: 'test' },
      ctx,
    );
    expect(released.checkpoint).toBeDefined();
    expect(calls.filter((key) => key.includes('/packs/') || key.includes('/segments/'))).toEqual([]);
    await again.destroy({ sandboxId, fence: 3 }, ctx);
  }, 120_000);
});
