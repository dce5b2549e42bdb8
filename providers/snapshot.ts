import { randomBytes } from 'node:crypto';
import type { Stats } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { pipeline, Transform } from 'node:stream';
import { setImmediate as setImmediatePromise } from 'node:timers/promises';
import { StasisError } from '../common/errors';
import { sha256Hex } from '../common/hashes';
import type { Checkpoint, Workspace } from '../common/schemas';
import type { CheckpointStore } from '../stores/api';
import { CHECKPOINT_DIRS, checkingStream, packSandbox, unpackCheckpoint, type ArchiveLimits } from '../stores/archive';
import { hasErrorCode, makeDirDurable, writeFileAtomic } from '../stores/atomic-file';
import { readBaseline, removeBaseline, writeBaseline, type Baseline } from '../stores/cas/baseline';
import { collectGarbage } from '../stores/cas/gc';
import { isManifestUri } from '../stores/cas/manifest';
import { markStage, restoreCheckpointFiles } from '../stores/cas/restore';
import { repeatCheckpoint, takeCheckpoint } from '../stores/cas/upload';
import { zstdAvailable } from '../stores/cas/zstd';
import { fsPath, nameFromBytes } from '../stores/raw-names';
import { writeKeepingHoles } from '../stores/zeros';
import { removeTree } from './files';
import type { SandboxPaths } from './sandbox-state';
import { sameWrites, syncFilesystem, volumeWrites, writeCount, type VolumeWrites } from './volume';

// Moving a sandbox's files to and from the checkpoint store. The caller freezes
// or kills the processes; these functions only deal with bytes and directories.

/** What a long transfer reports in its heartbeats. */
export interface Progress {
  phase: string;
  bytes: number;
}

export async function uploadSnapshot(input: {
  store: CheckpointStore;
  paths: SandboxPaths;
  sandboxId: string;
  fence: number;
  idempotencyKey: string;
  labels: Record<string, string>;
  limits: ArchiveLimits;
  progress: Progress;
  /**
   * `cas` (the default where the `zstd` command exists): content-addressed and incremental;
   * `tar`: one tar.gz, as earlier versions wrote (the default without `zstd`).
   */
  format?: CheckpointFormat;
  signal?: AbortSignal;
  /**
   * Given, the new baseline is not written here but handed over as `write`, for the caller to run
   * once its receipt is out: a baseline only speeds up the next checkpoint (it is not synced
   * either), and an older one whose checkpoint still exists is as sound, only less recent.
   */
  deferBaseline?: (write: () => Promise<void>) => void;
}): Promise<Checkpoint> {
  // One name per release request: a retry after a killed attempt replaces what that attempt left
  // (its object, its unfinished upload) instead of leaving it beside the new one. Attempts of
  // one request never overlap: they run under the sandbox's lifecycle lock.
  const name = `${input.fence}-${sha256Hex(input.idempotencyKey).slice(0, 16)}`;
  input.progress.phase = 'uploading checkpoint';
  const format = input.format ?? ((await zstdAvailable()) ? 'cas' : 'tar');
  if (format === 'tar') return uploadTarGz(input, `${checkpointPrefix(input.sandboxId)}${name}.tar.gz`);
  const baselineFile = path.join(input.paths.meta, BASELINE_FILE);
  const attemptFile = path.join(input.paths.meta, ATTEMPT_FILE);
  // takeCheckpoint reuses its chunks only while its checkpoint (whose manifest keeps its packs) exists.
  const baseline = await readBaseline(baselineFile);
  const unfinished = await fs.stat(attemptFile).then(
    () => true,
    () => false,
  );
  // Not synced: lost in a host crash, it only leaves an interrupted attempt's packs unnamed until
  // the sandbox's next collection or its destroy, which deletes its whole prefix.
  await fs.writeFile(attemptFile, name);
  // Packs are compressed through files beside the sandbox's state (never in its directories); a killed attempt's are removed here.
  await removeEntries(input.paths.root, (entry) => entry.startsWith(PACKING));
  const repeat = { store: input.store, prefix: checkpointPrefix(input.sandboxId), name, labels: input.labels };
  const taken =
    (await repeatIfUnchanged(input.paths, baseline, { ...repeat, limits: input.limits, signal: input.signal })) ??
    (await takeCheckpoint({
      store: input.store,
      rootDir: input.paths.volume,
      names: CHECKPOINT_DIRS,
      prefix: checkpointPrefix(input.sandboxId),
      name,
      labels: input.labels,
      limits: input.limits,
      ...(baseline ? { baseline } : {}),
      progress: input.progress,
      tempPrefix: path.join(input.paths.root, `${PACKING}${randomBytes(6).toString('hex')}`),
      ...(input.signal ? { signal: input.signal } : {}),
    }));
  // Deferred, it waits a turn of the event loop, as a restore's does: the caller's lock hands over in microtasks,
  // ahead of the answer's way out, and this serializes the whole manifest (~40 ms at 20,000 files in a profile).
  if (input.deferBaseline)
    input.deferBaseline(() => setImmediatePromise().then(() => writeBaseline(baselineFile, taken.baseline)));
  else await writeBaseline(baselineFile, taken.baseline);
  await fs.rm(attemptFile, { force: true });
  // An earlier attempt was killed part-way: its packs are named by no manifest. Collected with no grace, as
  // no other release of this sandbox can be in flight (they run under its lifecycle lock, on its one host).
  if (unfinished) {
    await collectGarbage(input.store, checkpointPrefix(input.sandboxId), { graceMs: 0 }).catch(() => undefined);
  }
  return taken.checkpoint;
}

/**
 * Records that the files on the sandbox's volume are exactly checkpoint `uri`, whose baseline this host
 * holds: called on a resume from the local copy (the files a release walked, untouched since: no
 * process of the sandbox ran), before any process of the sandbox starts. The volume is synced and its
 * write count read: if the next release finds the same count on the same mount, nothing on the
 * volume changed and the checkpoint is the baseline's again (repeatIfUnchanged). Where the count
 * tells nothing (no volume, an active workspace), nothing is recorded and the release walks.
 */
export async function recordUnchanged(paths: SandboxPaths, uri: string): Promise<void> {
  const stampFile = path.join(paths.meta, UNCHANGED_FILE);
  // A stamp no release or restore has used up: an earlier resume recorded it, then compute may have run
  // and the worker died before its state said so (local.ts writes the state after ensureCompute); the
  // state still reads dormant and stopped, but the files are no longer that checkpoint's. The walk decides.
  const stale = await fs.access(stampFile).then(
    () => true,
    () => false,
  );
  await fs.rm(stampFile, { force: true });
  if (stale) return;
  // The baseline written after the release may have failed: an older one is no description of these files.
  if ((await readBaseline(path.join(paths.meta, BASELINE_FILE)))?.uri !== uri) return;
  // Synced, so nothing written before (the mount's own writes) moves the count later.
  await syncFilesystem(paths.volume);
  const writes = await volumeWrites(paths);
  if (!writes) return;
  // Durable before any process of the sandbox starts: a stamp lost to a crash would let a retried resume record anew.
  const stamp: UnchangedStamp = { uri, writes };
  await writeFileAtomic(stampFile, JSON.stringify(stamp));
}

/** What recordUnchanged keeps beside the sandbox's state. */
interface UnchangedStamp {
  uri: string;
  writes: VolumeWrites;
}

/**
 * The baseline's checkpoint again, as a new one, when the volume's write count is the one recorded
 * when its files were that checkpoint (recordUnchanged), on the same mount: one PUT, no walk.
 * Undefined otherwise: the caller walks. The processes are frozen, so the count cannot move now.
 */
async function repeatIfUnchanged(
  paths: SandboxPaths,
  baseline: Baseline | undefined,
  input: Omit<Parameters<typeof repeatCheckpoint>[0], 'baseline' | 'likely' | 'unchanged' | 'signal'> & {
    signal: AbortSignal | undefined;
  },
): Promise<Awaited<ReturnType<typeof repeatCheckpoint>>> {
  const stampFile = path.join(paths.meta, UNCHANGED_FILE);
  const stamp = await readStamp(stampFile);
  // Used once: whatever this release takes, the next one starts from a resume of its own.
  await fs.rm(stampFile, { force: true });
  if (!stamp || !baseline || baseline.uri !== stamp.uri) return undefined;
  // The count only grows: one that moved already needs no sync (which would write back all the sandbox wrote).
  const likely = writeCount(stamp.writes).then(
    (kib) => kib === stamp.writes.kib,
    () => false,
  );
  const unchanged = (async () => {
    if (!(await likely)) return false;
    await syncFilesystem(paths.volume);
    const after = await volumeWrites(paths);
    return after !== undefined && sameWrites(after, stamp.writes);
  })().catch(() => false);
  const { signal, ...rest } = input;
  return repeatCheckpoint({ ...rest, baseline, likely, unchanged, ...(signal ? { signal } : {}) });
}

async function readStamp(file: string): Promise<UnchangedStamp | undefined> {
  try {
    const value = JSON.parse(await fs.readFile(file, 'utf8')) as Partial<UnchangedStamp>;
    return typeof value.uri === 'string' && typeof value.writes?.kib === 'string'
      ? (value as UnchangedStamp)
      : undefined;
  } catch {
    return undefined;
  }
}

/** The format of new checkpoints. */
export type CheckpointFormat = 'cas' | 'tar';

/** Beside the sandbox's state: the last checkpoint as this host saw it (stores/cas/baseline.ts). */
const BASELINE_FILE = 'checkpoint-baseline.json';
/** Beside the sandbox's state: the volume's write count when its files were a checkpoint (recordUnchanged). */
const UNCHANGED_FILE = 'checkpoint-unchanged.json';
/** Temporary pack files of a checkpoint upload, in the sandbox root (`<PACKING><hex>.<n>`). */
const PACKING = '.packing-';
/** Present while a checkpoint upload is under way: a release that finds it knows an earlier one was killed. */
const ATTEMPT_FILE = 'checkpoint-attempt';

async function uploadTarGz(
  input: {
    store: CheckpointStore;
    paths: SandboxPaths;
    labels: Record<string, string>;
    limits: ArchiveLimits;
    progress: Progress;
    signal?: AbortSignal;
  },
  key: string,
): Promise<Checkpoint> {
  // Counted in the pipe (not with a 'data' listener, which would start the flow before the store reads it).
  const counted = new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      input.progress.bytes += chunk.length;
      callback(null, chunk);
    },
  });
  // The archive passes restore's own checks on its way out, so no checkpoint that restore would refuse is ever taken.
  let refused: StasisError | undefined;
  const checked = checkingStream(input.limits).on('error', (err) => {
    if (err instanceof StasisError) refused = err;
  });
  pipeline(packSandbox(input.paths.volume, CHECKPOINT_DIRS, input.signal), checked, counted, () => {}); // errors reach the store through `counted`
  try {
    return await input.store.put(key, counted, input.labels, input.signal);
  } catch (err) {
    throw refused ?? err;
  }
}

/** Where all checkpoints of a sandbox live; destroying the sandbox deletes them. */
export function checkpointPrefix(sandboxId: string): string {
  return `checkpoints/${sandboxId}/`;
}

/**
 * Downloads and verifies `checkpoint`, unpacks it into a staging directory
 * on the sandbox's volume, then swaps the directories into place and syncs
 * them. Returns the checkpoint's labels, and `ready`: settles once the files are on disk and past their
 * racy window (the baseline handed over); the caller may start compute before, and runs nothing in it
 * until then. An active workspace is host-persistent: its host path is
 * only filled from the checkpoint when it is empty (a restore on another host).
 * A restore interrupted anywhere (a full disk, a killed worker) can simply be
 * run again: it first removes what an earlier attempt left, and only complete
 * trees are renamed into place.
 */
export async function restoreSnapshot(input: {
  store: CheckpointStore;
  checkpoint: Checkpoint;
  paths: SandboxPaths;
  workspace: Workspace;
  limits: ArchiveLimits;
  progress: Progress;
  /** Called right before the first tree is swapped in: from then on the sandbox's files are no longer what they were. */
  beforeSwap: () => Promise<void>;
  /**
   * Settles once the sandbox's volume is made and mounted (the caller makes it meanwhile): the
   * checkpoint downloads into the sandbox root before, nothing is written on the volume until then.
   */
  volumeReady?: Promise<void>;
  /** As uploadSnapshot's: given, the baseline is handed over as `write`, for after the caller's answer. */
  deferBaseline?: (write: () => Promise<void>) => void;
  signal?: AbortSignal;
}): Promise<{ labels: Record<string, string>; ready: Promise<void> }> {
  const { paths } = input;
  // Restores of one sandbox never overlap (they run under its lifecycle lock): whatever matches is an earlier attempt's.
  // Durably, as layOut makes it (meanwhile, on a new host): whichever of the two creates it syncs its entry.
  await makeDirDurable(paths.root);
  await removeEntries(paths.root, (name) => name.startsWith(STAGING));
  // Staged on the sandbox's volume (the swap is a rename there), downloaded beside it (the archive is not its files).
  const name = `${STAGING}${randomBytes(6).toString('hex')}`;
  const staging = path.join(paths.volume, name);
  const downloads = path.join(paths.root, name);
  const archive = `${downloads}.tar.gz`;
  const baselineFile = path.join(paths.meta, BASELINE_FILE);
  const stagingReady = (async () => {
    await input.volumeReady;
    await removeEntries(paths.volume, (entry) => entry.startsWith(STAGING) || SWAPPED_OUT.test(entry));
    await fs.mkdir(staging);
    markStage('staging ready');
  })();
  stagingReady.catch(() => undefined); // awaited below, also when the download fails first
  // The syncs started while the files were written (restoreCheckpointFiles' flush), if any.
  let flushed: Promise<void> = Promise.resolve();
  try {
    let labels: Record<string, string>;
    let baseline: Promise<Baseline> | undefined;
    if (isManifestUri(input.checkpoint.uri)) {
      input.progress.phase = 'restoring checkpoint';
      ({ labels, baseline, flushed } = await restoreCheckpointFiles({
        store: input.store,
        checkpoint: input.checkpoint,
        targetDir: staging,
        tempPrefix: downloads,
        limits: input.limits,
        progress: input.progress,
        targetReady: stagingReady,
        flush: () => syncFilesystem(paths.volume),
        ...(input.signal ? { signal: input.signal } : {}),
      }));
    } else {
      // A tar.gz checkpoint of an earlier version.
      input.progress.phase = 'downloading checkpoint';
      ({ labels } = await input.store.download(input.checkpoint, archive, input.signal));
      await stagingReady;
      input.progress.phase = 'unpacking checkpoint';
      await unpackCheckpoint(archive, staging, input.limits);
    }
    input.signal?.throwIfAborted();
    for (const dir of CHECKPOINT_DIRS) await fs.mkdir(path.join(staging, dir), { recursive: true });
    markStage('checkpoint unpacked');
    await input.beforeSwap();
    // From here the files are no longer what the old baseline describes.
    await removeBaseline(baselineFile);
    await fs.rm(path.join(paths.meta, UNCHANGED_FILE), { force: true });
    await swapInto(path.join(staging, 'home'), paths.home);
    await swapInto(path.join(staging, 'envs'), paths.envs);
    if (input.workspace.kind === 'isolated') await swapInto(path.join(staging, 'workspace'), paths.workspace);
    else await fillIfEmpty(path.join(staging, 'workspace'), input.workspace.hostPath);
    markStage('swapped in');
    // On disk before the caller records the restore (a retry after a crash trusts a recorded one):
    // one syncfs of the volume (files and renames) instead of an fsync of each file, while the
    // racy window passes and the caller starts the sandbox (neither needs the files on disk).
    const workspace = input.workspace;
    const synced = (async () => {
      const syncing = syncFilesystem(paths.volume);
      // A flush of the writer's that failed fails the restore (see Flusher in restore.ts), once this sync is done too.
      await flushed.catch(async (err: unknown) => {
        await syncing.catch(() => undefined);
        throw err;
      });
      await syncing;
      // A filled host path is on its own filesystem (a copy when the sandbox's volume is another).
      if (workspace.kind !== 'isolated') await syncFilesystem(workspace.hostPath);
      markStage('synced');
    })();
    synced.catch(() => undefined); // awaited by `ready`
    // Nothing may change the files before the racy window of the last one written has passed: the caller
    // starts the sandbox meanwhile (its start writes none of them) and runs nothing in it before `ready`.
    // Awaited here before the return, the window held the start back (~35 ms of a 64 MiB restore).
    const ready = (async () => {
      let written: Baseline | undefined;
      try {
        written = await baseline;
      } finally {
        await synced.catch(() => undefined);
      }
      // The files as just written are the next suspend's baseline: a resume does not make everything dirty.
      if (written && input.deferBaseline) {
        // Deferred is after the answer only past a turn of the event loop: the caller's lock hands over in
        // microtasks, ahead of the answer's way out, and this serializes the whole manifest (~50-140 ms at 20,000 files).
        input.deferBaseline(() => setImmediatePromise().then(() => writeBaseline(baselineFile, written)));
      } else if (written) await writeBaseline(baselineFile, written);
      markStage('baseline written');
      await synced;
    })();
    ready.catch(() => undefined); // the caller's to wait for
    return { labels, ready };
  } catch (err) {
    // No sync of the writer's outlives a failed restore (it is awaited by `synced` otherwise).
    await flushed.catch(() => undefined);
    throw err;
  } finally {
    // Never removed while the volume is still being made (the staging directory would be made after).
    await stagingReady.catch(() => undefined);
    // As any tree of the sandbox's (a worker that is not root may have to grant itself a directory's owner bits).
    await removeTree(staging);
    await fs.rm(archive, { force: true });
  }
}

/** A restore's staging directory on the sandbox's volume (and `<staging>.tar.gz`, its download, in the sandbox root). */
const STAGING = '.restore-';
/** A tree a swap moved aside (`home.old-<hex>`), removed once the new one is in place. */
const SWAPPED_OUT = new RegExp(`^(${CHECKPOINT_DIRS.join('|')})\\.old-[0-9a-f]+$`);

/** Replaces `dest` with `src` (same filesystem) by two renames; the old tree is removed afterwards. */
async function swapInto(src: string, dest: string): Promise<void> {
  const old = `${dest}.old-${randomBytes(6).toString('hex')}`;
  const hadOld = await fs.rename(dest, old).then(
    () => true,
    (err: unknown) => {
      if (hasErrorCode(err, 'ENOENT')) return false;
      throw err;
    },
  );
  await fs.rename(src, dest);
  // The old tree was the sandbox's: removed without following any link a process of it may have swapped in.
  if (hadOld) await removeTree(old);
}

/**
 * Fills an empty host path with `src`. The tree is staged beside the host path
 * (on its filesystem) and renamed onto it in one step, which replaces the empty
 * directory: the host path is either untouched or whole, never half-filled, so
 * an interrupted fill is simply done again.
 */
async function fillIfEmpty(src: string, hostPath: string): Promise<void> {
  const parent = path.dirname(hostPath);
  const prefix = `.${path.basename(hostPath)}.stasis-restore-`;
  await fs.mkdir(hostPath, { recursive: true });
  await removeEntries(parent, (name) => name.startsWith(prefix));
  if ((await fs.readdir(hostPath)).length > 0) return;
  const temp = path.join(parent, `${prefix}${randomBytes(6).toString('hex')}`);
  try {
    await moveTree(src, temp);
    await fs.rename(temp, hostPath);
  } catch (err) {
    if (hasErrorCode(err, 'EBUSY') || hasErrorCode(err, 'EXDEV')) {
      // The host path is a mount point and cannot be replaced: its entries are moved in one by one.
      for (const name of await rawNames(temp)) {
        await fs.rename(fsPath(path.join(temp, name)), fsPath(path.join(hostPath, name)));
      }
      await removeTree(temp);
      return;
    }
    await removeTree(temp);
    // Filled meanwhile by someone else: their files stay.
    if (hasErrorCode(err, 'ENOTEMPTY') || hasErrorCode(err, 'EEXIST')) return;
    throw err;
  }
}

/** Renames `src` to `dest`, or copies it there (copyTree) when they are on different filesystems. */
async function moveTree(src: string, dest: string): Promise<void> {
  try {
    await fs.rename(src, dest);
  } catch (err) {
    if (!hasErrorCode(err, 'EXDEV')) throw err;
    await copyTree(src, dest);
  }
}

/**
 * Copies the tree at `src` (a restore's own, nothing else writes it) to `dest` (new): symlinks verbatim,
 * modes and mtimes kept, and a file's holes (stores/zeros.ts). Not fs.cp: it writes a sparse file's zeros
 * out, so a sandbox's `truncate -s 20G` would take 20 GiB of the host path's disk.
 */
async function copyTree(src: string, dest: string): Promise<void> {
  // Names as bytes (stores/raw-names.ts): one that is not UTF-8 is copied as it is, never as U+FFFD.
  const [from, to] = [fsPath(src), fsPath(dest)];
  const stat = await fs.lstat(from);
  if (stat.isSymbolicLink()) {
    await fs.symlink(await fs.readlink(from, { encoding: 'buffer' }), to);
    await fs.lutimes(to, stat.atime, stat.mtime);
  } else if (stat.isDirectory()) {
    await fs.mkdir(to, { mode: 0o700 });
    for (const name of await rawNames(src)) await copyTree(path.join(src, name), path.join(dest, name));
    await fs.chmod(to, stat.mode & 0o7777);
    await fs.utimes(to, stat.atime, stat.mtime);
  } else if (stat.isFile()) {
    await copyFile(from, to, stat);
  } else {
    throw new Error(`${src} is not a file, directory or symlink`);
  }
}

/** The names in `dir` as strings of their bytes (stores/raw-names.ts). */
async function rawNames(dir: string): Promise<string[]> {
  return (await fs.readdir(fsPath(dir), { encoding: 'buffer' })).map(nameFromBytes);
}

/** Copies a file, leaving its blocks of zeros holes, with its mode and times. */
async function copyFile(src: string | Buffer, dest: string | Buffer, stat: Stats): Promise<void> {
  const from = await fs.open(src, 'r');
  try {
    const to = await fs.open(dest, 'wx', 0o600);
    try {
      const buffer = Buffer.allocUnsafe(COPY_BYTES);
      let position = 0;
      for (;;) {
        const { bytesRead } = await from.read(buffer, 0, buffer.length, position);
        if (bytesRead === 0) break;
        const piece = buffer.subarray(0, bytesRead);
        await writeKeepingHoles(to, piece, position);
        position += bytesRead;
      }
      await to.truncate(position);
      await to.chmod(stat.mode & 0o7777);
      await to.utimes(stat.atime, stat.mtime);
    } finally {
      await to.close();
    }
  } finally {
    await from.close();
  }
}

/** A file is copied this much at a time. */
const COPY_BYTES = 1024 * 1024;

/** Removes the entries of `dir` whose name `matches` (symlinks as links: nothing is followed). */
async function removeEntries(dir: string, matches: (name: string) => boolean): Promise<void> {
  let names: string[];
  try {
    names = await fs.readdir(dir);
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return;
    throw err;
  }
  for (const name of names.filter(matches)) await removeTree(path.join(dir, name));
}
