import { channel } from 'node:diagnostics_channel';
import { setMaxListeners } from 'node:events';
import * as fsSync from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { StasisError } from '../../common/errors';
import type { Checkpoint } from '../../common/schemas';
// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore, DownloadCheck } from '../index';
import type { ArchiveLimits } from '../archive';
import { fsPath } from '../raw-names';
import { Slicer } from '../walk';
import { dataRuns } from '../zeros';
import { nowNs, racyUntilNs, type Baseline } from './baseline';
import { chunkHash, hashSpans } from './hasher';
import { Lanes } from './lanes';
import {
  checkPackRef,
  invalid,
  packsPrefixOf,
  readManifest,
  storedMtime,
  type Manifest,
  type ManifestEntry,
  type PackRef,
} from './manifest';
import { zstdDecompressFile, zstdRawFrameFile } from './zstd';

// Restoring a content-addressed checkpoint into an empty directory of the worker's
// own: the manifest (with its segments, each verified by its hash) is checked whole
// before anything is written, then the packs
// it needs are downloaded a few at a time ahead of the writer, each chunk is
// verified against its hash, and files are written directly. Symlinks come
// last, so nothing is ever written through one; then directory modes and times.
// The files are written with synchronous calls in slices between turns of the
// event loop (as the walk reads them, see stores/walk.ts): one asynchronous call
// per step made a restore of 20,000 small files wait on the thread pool for seconds.

/**
 * Where a restore is, for bench/restore-profile.ts: `{ stage, ns }` marks published on this
 * channel only while something subscribes (a check of one flag otherwise).
 */
export const restoreStages = channel('stasis:restore-stages');

export function markStage(stage: string): void {
  if (restoreStages.hasSubscribers) restoreStages.publish({ stage, ns: process.hrtime.bigint() });
}

/** Packs held decompressed (and verified) at once, ahead of the writer: up to 6 × 8 MiB of memory. */
const PACKS_AHEAD = 6;
/**
 * Packs downloaded ahead of the writer, compressed, to temporary files (up to 16 × 8 MiB of disk):
 * apart from the packs held decompressed, so the downloads never wait for the writer. When one
 * window held both, a 64 MiB checkpoint's last two packs were only asked for once the writer had
 * used up the first two, and it then waited ~150 ms for them.
 */
const FETCH_AHEAD = 16;
/**
 * Pack downloads at once, the pack needed soonest first: six at once shared the store's bandwidth
 * (a local MinIO: its CPU) six ways, and the writer waited for the first pack until all had come.
 */
const DOWNLOADING = 3;
/**
 * zstd processes at once, the pack the writer needs soonest first: four at once on two cores finished
 * together, and the writer waited for all of them to have the first.
 */
const DECOMPRESSING = 2;

/**
 * A pack's download checks its size only: every chunk taken from it is hashed against its name (and a
 * frame that does not decompress to the size its ref records is refused), so no byte written comes
 * unverified. Hashing each whole pack as well was ~25 ms of the main thread in a 64 MiB restore (~8%
 * of its CPU). A corrupt pack is still CHECKPOINT_INVALID naming it (and the chunk, when that is what
 * its corruption changed).
 */
const PACK_CHECK: DownloadCheck = 'size';

const NEW_FILE =
  fsSync.constants.O_WRONLY | fsSync.constants.O_CREAT | fsSync.constants.O_EXCL | fsSync.constants.O_NOFOLLOW;

/**
 * Restores `checkpoint` into `targetDir` (empty). Temporary downloads go to
 * `${tempPrefix}.*`. Returns the checkpoint's labels and the baseline for the
 * next checkpoint of these files. A missing or corrupt pack or chunk is
 * CHECKPOINT_INVALID naming it; any other failure (a full disk, the store down)
 * is thrown as it is, to be retried.
 */
export async function restoreCheckpoint(
  input: RestoreInput,
): Promise<{ labels: Record<string, string>; baseline: Baseline }> {
  const { labels, baseline } = await restoreCheckpointFiles(input);
  return { labels, baseline: await baseline };
}

interface RestoreInput {
  store: CheckpointStore;
  checkpoint: Checkpoint;
  targetDir: string;
  tempPrefix: string;
  limits: ArchiveLimits;
  progress: { bytes: number };
  signal?: AbortSignal;
  /**
   * Settles once `targetDir` exists (the sandbox's volume is made and mounted meanwhile): the top
   * object, the segments and the first packs are fetched before, nothing is written until then.
   */
  targetReady?: Promise<unknown>;
  /**
   * Writes back what is on the target's filesystem so far (a syncfs): started in the background while
   * the files are written, one at a time, so that the caller's sync at the end has less left to write.
   */
  flush?: () => Promise<void>;
}

/**
 * restoreCheckpoint, returning as soon as the files are written: `baseline` settles once the clock
 * is past the racy window of the last file written (pastRacyWindow), which nothing may change before.
 * The caller waits for it before it starts anything that writes the files, and meanwhile does what
 * does not (swap them into place, sync them).
 */
export async function restoreCheckpointFiles(
  input: RestoreInput,
): Promise<{ labels: Record<string, string>; baseline: Promise<Baseline>; flushed: Promise<void> }> {
  const { checkpoint, signal } = input;
  // Failing first, this restore leaves the target's failure, if any, unawaited: it is the caller's to see.
  input.targetReady?.catch(() => undefined);
  const manifestFile = `${input.tempPrefix}.manifest`;
  let labels: Record<string, string>;
  let data: Buffer;
  try {
    ({ labels } = await input.store.download(checkpoint, manifestFile, signal));
    data = await fs.readFile(manifestFile);
  } finally {
    await fs.rm(manifestFile, { force: true });
  }
  markStage('top object fetched');
  const downloading = new Lanes(DOWNLOADING);
  const decompressing = new Lanes(DECOMPRESSING);
  // A restore that fails cancels its downloads: those under way and those waiting for a lane (up to
  // FETCH_AHEAD packs) would otherwise all be fetched before its failure is reported.
  const stop = new AbortController();
  const inner = signal ? AbortSignal.any([signal, stop.signal]) : stop.signal;
  // Every request in flight listens to it (the lanes bound them, each removes its listener when
  // done): more than Node's leak warning threshold of 10 is expected.
  setMaxListeners(0, inner);
  const prefetch = new Prefetch(input.store, checkpoint.uri, input.tempPrefix, inner, downloading, decompressing);
  try {
    return await writeFiles({ ...input, signal: inner }, labels, data, prefetch, downloading, decompressing, stop);
  } catch (err) {
    stop.abort(err);
    throw err;
  } finally {
    await prefetch.close();
  }
}

async function writeFiles(
  input: RestoreInput,
  labels: Record<string, string>,
  data: Buffer,
  prefetch: Prefetch,
  downloading: Lanes,
  decompressing: Lanes,
  /** Aborted (cancelling the downloads) once the restore has failed. */
  stop: AbortController,
): Promise<{ labels: Record<string, string>; baseline: Promise<Baseline>; flushed: Promise<void> }> {
  const { checkpoint, signal } = input;
  // The first packs download while the segments are fetched and the manifest checked, and the volume is made.
  const manifest = await readManifest(input.store, data, checkpoint.uri, input.limits, signal, (packs) =>
    prefetch.start(packs),
  );
  markStage('manifest read');
  const packs = new PackReader(
    input.store,
    checkpoint.uri,
    manifest,
    input.tempPrefix,
    input.progress,
    signal,
    prefetch,
    downloading,
    decompressing,
  );
  const target = path.resolve(input.targetDir);
  // Entry paths are normal here (checkManifest: no `.`, `..` or empty segment, no leading `/`): joined
  // as they are (path.join per entry was ~60 ms of a 20,000-file restore). A path holding a name that
  // is not UTF-8 (escaped, raw-names.ts) is given to fs as its bytes.
  const absolute = (entry: ManifestEntry) => fsPath(`${target}/${entry.p}`);
  const local: Baseline['local'] = {};
  const slicer = new Slicer();
  const flusher = new Flusher(input.flush);
  try {
    // The first packs decompress and are verified while the target is still being made.
    packs.start();
    await input.targetReady;
    markStage('target ready');
    for (const entry of manifest.entries) {
      if (entry.k !== 'd') continue;
      if (slicer.due()) await slicer.turn();
      fsSync.mkdirSync(absolute(entry), { recursive: true, mode: 0o700 });
    }
    markStage('directories made');
    for (const entry of manifest.entries) {
      signal?.throwIfAborted();
      // Asked, not awaited, per entry: a promise per entry (pause) was a few percent of a 20,000-file restore.
      if (slicer.due()) await slicer.turn();
      if (entry.k === 'f') {
        const writing = writeFile(absolute(entry), entry, packs);
        const written = writing instanceof Promise ? await writing : writing;
        local[entry.p] = [written.ino.toString(), written.ctimeNs.toString()];
        // The baseline holds the mtime as written here, as the next checkpoint will describe it.
        asRestored(entry, storedMtime(written.mtimeNs));
        flusher.wrote(entry.s);
        continue;
      }
      asRestored(entry, storedMtime(BigInt(entry.mt)));
      if (entry.k === 'h') {
        const first = fsPath(path.join(target, ...(entry.l ?? '').split('/')));
        // link(2) does not follow a symlink at the source, and the manifest's checks made it a regular file anyway.
        fsSync.linkSync(first, absolute(entry));
        // A link changes the file's ctime: the baseline takes it again, or the next suspend would read the file.
        const linked = fsSync.lstatSync(first, { bigint: true });
        if (entry.l !== undefined && local[entry.l])
          local[entry.l] = [linked.ino.toString(), linked.ctimeNs.toString()];
      }
    }
  } catch (err) {
    stop.abort(err);
    // No sync of this restore outlives it.
    await flusher.idle().catch(() => undefined);
    throw err;
  } finally {
    await packs.close();
  }
  markStage('files written');
  for (const entry of manifest.entries) {
    if (entry.k !== 'l') continue;
    if (slicer.due()) await slicer.turn();
    // The target verbatim, as its bytes.
    fsSync.symlinkSync(fsPath(entry.l ?? ''), absolute(entry));
    const time = seconds(entry.mt);
    fsSync.lutimesSync(absolute(entry), time, time);
  }
  // Directories last (writing into one changes its mtime), deepest first.
  const directories = manifest.entries.filter((entry) => entry.k === 'd');
  // Each one's depth counted once, not in each comparison.
  const depth = new Map(directories.map((dir) => [dir, dir.p.split('/').length]));
  directories.sort((a, b) => (depth.get(b) ?? 0) - (depth.get(a) ?? 0));
  for (const dir of directories) {
    if (slicer.due()) await slicer.turn();
    fsSync.chmodSync(absolute(dir), dir.m);
    const time = seconds(dir.mt);
    fsSync.utimesSync(absolute(dir), time, time);
  }
  markStage('links and directory modes set');
  const baseline = pastRacyWindow(local, signal).then((takenAtNs) => {
    markStage('racy window passed');
    return {
      uri: checkpoint.uri,
      takenAtNs: takenAtNs.toString(),
      // Its entries as restored (asRestored).
      manifest,
      local,
    };
  });
  baseline.catch(() => undefined); // awaited by the caller, which may fail first
  const flushed = flusher.idle();
  flushed.catch(() => undefined); // awaited by the caller, which may fail first
  return { labels, baseline, flushed };
}

/**
 * File bytes, or files, written before the writer starts a flush (none starts while one runs). The
 * bytes grow with what was written (half of it): a flush every 16 MiB made a 512 MiB restore ~10%
 * slower (its files written later, the disk busy either way), where one every 64 MiB did not.
 */
const FLUSH_BYTES = 16 * 1024 * 1024;
const FLUSH_FILES = 2500;

/**
 * Flushes in the background while the files are written: the writer is held by its CPU (a file's
 * calls, the manifest, the packs), the disk is idle meanwhile, and the page cache would otherwise
 * hold everything until the caller's sync. A flush's failure fails the restore: a later syncfs (a
 * new descriptor) does not report a writeback error that came before it was opened.
 */
class Flusher {
  private bytes = 0;
  private files = 0;
  private total = 0;
  private running: Promise<void> | undefined;
  private failure: { err: unknown } | undefined;
  private last: Promise<void> = Promise.resolve();

  constructor(private readonly flush: (() => Promise<void>) | undefined) {}

  /** Counts a file written; starts a flush when enough was written since the last one started. */
  wrote(bytes: number): void {
    if (this.failure) throw this.failure.err;
    if (!this.flush) return;
    this.bytes += bytes;
    this.files += 1;
    this.total += bytes;
    if (this.running || (this.bytes < Math.max(FLUSH_BYTES, this.total / 2) && this.files < FLUSH_FILES)) return;
    this.bytes = 0;
    this.files = 0;
    markStage('flush started');
    const running = this.flush().then(
      () => {
        markStage('flush done');
        this.running = undefined;
      },
      (err: unknown) => {
        this.running = undefined;
        this.failure = { err };
        throw err;
      },
    );
    running.catch(() => undefined); // the writer's next file, or idle, reports it
    this.running = running;
    this.last = running;
  }

  /** Settles once no flush runs; rejects if one failed. */
  async idle(): Promise<void> {
    await this.last.catch(() => undefined);
    if (this.failure) throw this.failure.err;
  }
}

/**
 * The racy rule for a restore's baseline (see unchangedFile in upload.ts): a file whose ctime is still
 * racy (racyUntilNs) at the baseline's time is read again, since a change in the same clock tick leaves
 * its ctime as it was. Waiting here until the clock is past the last racy ctime written (at most ~50 ms,
 * once per restore) makes every restored file trusted by its stat, and any later change to one gives it
 * a ctime the baseline does not hold. Returns the baseline's time. A window longer than MAX_RACY_WAIT_MS
 * is not waited for (a filesystem keeping whole seconds, or one whose clock runs ahead of ours): the
 * files still racy then are read again by the next suspend (none of them is uploaded unless changed).
 */
export async function pastRacyWindow(local: Baseline['local'], signal: AbortSignal | undefined): Promise<bigint> {
  let until = 0n;
  for (const [, ctime] of Object.values(local)) {
    const racy = racyUntilNs(BigInt(ctime));
    if (racy > until) until = racy;
  }
  const start = nowNs();
  if (until - start > MAX_RACY_WAIT_MS * 1_000_000n) return start;
  for (let now = start; now <= until; now = nowNs()) {
    await delay(Number((until - now) / 1_000_000n) + 1, undefined, signal ? { signal } : {});
  }
  return nowNs();
}

/** The longest a restore waits for its racy window (it is RACY_MARGIN_NS when the clocks agree and keep ns). */
const MAX_RACY_WAIT_MS = 250n;

/**
 * Makes the entry (the manifest's own, used once written) the baseline's: its mtime as restored (to the
 * microsecond), no ctime of another host. In place: a copy of each of 20,000 entries was garbage to collect.
 */
function asRestored(entry: ManifestEntry, mt: string): void {
  entry.mt = mt;
  if (entry.ct !== undefined) delete entry.ct;
}

/**
 * Writes a file; without a promise when the packs of its chunks are loaded (nearly every file of many
 * small ones): the writer then awaits nothing per file.
 */
function writeFile(
  file: string | Buffer,
  entry: ManifestEntry,
  packs: PackReader,
): fsSync.BigIntStats | Promise<fsSync.BigIntStats> {
  // Created with its mode (the umask may take bits away: then fchmod below); it is in the staging
  // directory, nobody else's until the swap, so its mode before its bytes are written matters to none.
  const fd = fsSync.openSync(file, NEW_FILE, entry.m);
  let handedOver = false;
  try {
    const hashes = entry.c ?? [];
    const at: FileAt = { written: 0, end: 0 };
    for (let i = 0; i < hashes.length; i += 1) {
      const chunk = packs.chunkNow(hashes[i], entry.p);
      if (chunk === undefined) {
        handedOver = true;
        return writeRest(fd, file, entry, packs, i, at);
      }
      writeChunk(fd, chunk, at);
    }
    return finishFile(fd, file, entry, at);
  } finally {
    if (!handedOver) fsSync.closeSync(fd);
  }
}

/** The rest of writeFile from chunk `from` on, waiting for packs as needed; closes the descriptor. */
async function writeRest(
  fd: number,
  file: string | Buffer,
  entry: ManifestEntry,
  packs: PackReader,
  from: number,
  at: FileAt,
): Promise<fsSync.BigIntStats> {
  try {
    const hashes = entry.c ?? [];
    for (let i = from; i < hashes.length; i += 1) writeChunk(fd, await packs.chunk(hashes[i], entry.p), at);
    return finishFile(fd, file, entry, at);
  } finally {
    fsSync.closeSync(fd);
  }
}

/** Where a file being written is: its bytes so far (holes included), and the end of the last one written. */
interface FileAt {
  written: number;
  end: number;
}

/** Writes a chunk where the file is, leaving its blocks of zeros holes (stores/zeros.ts). */
function writeChunk(fd: number, chunk: Buffer, at: FileAt): void {
  for (const [start, end] of dataRuns(chunk, at.written)) {
    writeAll(fd, chunk.subarray(start, end), at.written + start);
    at.end = at.written + end;
  }
  at.written += chunk.length;
}

/**
 * Checks a written file's length, gives it its length if it ends in a hole, sets its mtime (and mode
 * if the umask took bits) and returns its stat.
 */
function finishFile(
  fd: number,
  file: string | Buffer,
  entry: ManifestEntry,
  { written, end }: FileAt,
): fsSync.BigIntStats {
  // A short write (a full disk can end one without an error) must never pass for the whole file.
  if (written !== entry.s) throw new Error(`${file.toString()}: wrote ${written} of ${entry.s} bytes`);
  if (end < written) fsSync.ftruncateSync(fd, written);
  const time = seconds(entry.mt);
  fsSync.futimesSync(fd, time, time);
  // The stat is the baseline's (its ctime after the last change): taken again only after an fchmod.
  const stat = fsSync.fstatSync(fd, { bigint: true });
  if (Number(stat.mode & 0o7777n) === entry.m) return stat;
  fsSync.fchmodSync(fd, entry.m);
  return fsSync.fstatSync(fd, { bigint: true });
}

/** Writes all of `chunk` at `position` in the file (one write(2) may take only part of it). */
function writeAll(fd: number, chunk: Buffer, position: number): void {
  for (let offset = 0; offset < chunk.length;) {
    const bytesWritten = fsSync.writeSync(fd, chunk, offset, chunk.length - offset, position + offset);
    if (bytesWritten === 0) {
      throw Object.assign(new Error(`no space left to write ${chunk.length - offset} bytes`), { code: 'ENOSPC' });
    }
    offset += bytesWritten;
  }
}

/**
 * Seconds for utimes, as a numeric string: Node takes a number below 0 as "now" (a file of 1969 came back
 * dated today), a numeric string as it is. It becomes a double, which keeps about a quarter of a
 * microsecond at today's dates, and libuv truncates its nanoseconds toward zero, then to the microsecond:
 * aimed half a microsecond past the microsecond on the side away from zero, so it always comes back.
 */
function seconds(ns: string): string {
  const value = BigInt(ns);
  // Whole seconds rounded down and the microseconds past them (0-999,999), before 1970 as after.
  let whole = value / 1_000_000_000n;
  let rest = value % 1_000_000_000n;
  if (rest < 0n) {
    rest += 1_000_000_000n;
    whole -= 1n;
  }
  const micros = Number(rest / 1000n);
  const nudge = whole < 0n ? -500 : 500;
  return String(Number(whole) + (micros * 1000 + nudge) / 1e9);
}

/** A pack's decompressed bytes, and the chunks in it whose bytes do not hash to their name (→ what they hash to). */
interface LoadedPack {
  bytes: Buffer;
  corrupt: Map<string, string>;
}

/** A pack held on disk instead of in memory (see dropFarthest): its decompressed bytes, checked, in a file of ours. */
interface SpilledPack {
  fd: number;
  file: string;
  corrupt: Map<string, string>;
}

/**
 * The chunks of a manifest, in the order the files need them: packs are fetched
 * a few ahead, held decompressed only until their last chunk is taken, and
 * every chunk is checked against its hash before it is handed out.
 */
class PackReader {
  /** Pack indexes in the order of first use (and each pack's place in it), and how many chunk reads each still has. */
  private readonly order: number[] = [];
  private readonly rank = new Map<number, number>();
  private readonly uses = new Map<number, number>();
  private readonly loading = new Map<number, Promise<LoadedPack>>();
  private readonly started = new Set<Promise<LoadedPack>>();
  /** Downloads started (of the first `fetched` packs of `order`), each to its pack's temporary file. */
  private readonly fetching = new Map<number, Promise<unknown>>();
  private fetched = 0;
  /** Each pack's chunks that this manifest names, by hash. */
  private readonly chunksOf = new Map<number, Set<string>>();
  /** Each pack's chunk reads, by their place among all the writer's reads (see dropFarthest). */
  private readonly readsOf = new Map<number, number[]>();
  /** Chunk reads so far. */
  private reads = 0;
  /** Packs dropped before their last use (dropFarthest), to be loaded again: their downloads go to files of their own. */
  private readonly reloads = new Set<number>();
  private next = 0;
  private closed = false;
  /** Decompressed bytes of packs the prefetch had decompressed, until their load takes them. */
  private readonly early = new Map<number, Promise<Buffer>>();
  /** Packs loaded (decompressed and verified): the writer takes their chunks without waiting. */
  private readonly loaded = new Map<number, LoadedPack>();
  /** Packs dropped a second time before their last use: read from their files until then (dropFarthest). */
  private readonly spilled = new Map<number, SpilledPack>();

  constructor(
    private readonly store: CheckpointStore,
    private readonly uri: string,
    private readonly manifest: Manifest,
    private readonly tempPrefix: string,
    private readonly progress: { bytes: number },
    private readonly signal: AbortSignal | undefined,
    private readonly prefetch: Prefetch,
    private readonly downloading: Lanes,
    private readonly decompressing: Lanes,
  ) {
    for (const entry of manifest.entries) {
      for (const hash of entry.c ?? []) {
        const pack = manifest.chunks[hash][0];
        if (!this.uses.has(pack)) {
          this.rank.set(pack, this.order.length);
          this.order.push(pack);
        }
        const chunks = this.chunksOf.get(pack) ?? new Set<string>();
        this.chunksOf.set(pack, chunks);
        chunks.add(hash);
        this.uses.set(pack, (this.uses.get(pack) ?? 0) + 1);
        const reads = this.readsOf.get(pack) ?? [];
        this.readsOf.set(pack, reads);
        reads.push(this.reads);
        this.reads += 1;
      }
    }
  }

  /** The chunk, checked against its hash, if its pack is loaded (no promise made); undefined if not: then `chunk`. */
  chunkNow(hash: string, entryPath: string): Buffer | undefined {
    const pack = this.manifest.chunks[hash][0];
    this.fetchAhead(pack);
    const held = this.loaded.get(pack) ?? this.spilled.get(pack);
    return held && this.take(hash, entryPath, held);
  }

  async chunk(hash: string, entryPath: string): Promise<Buffer> {
    const now = this.chunkNow(hash, entryPath);
    if (now !== undefined) return now;
    const pack = this.manifest.chunks[hash][0];
    const loading = this.loading.get(pack);
    if (!loading) throw new Error(`pack ${pack} of ${this.uri} read more often than its manifest says`);
    if (restoreStages.hasSubscribers) {
      markStage(`writer waits for pack ${pack}`);
      await loading.catch(() => undefined);
      markStage(`writer has pack ${pack}`);
    }
    return this.take(hash, entryPath, await loading);
  }

  /** The chunk's bytes from its loaded (or spilled) pack, unless they do not hash to its name; counts the read. */
  private take(hash: string, entryPath: string, held: LoadedPack | SpilledPack): Buffer {
    const [pack, offset, length] = this.manifest.chunks[hash];
    const bad = held.corrupt.get(hash);
    if (bad !== undefined) {
      throw invalid(
        this.uri,
        `has a corrupt chunk ${hash} of ${JSON.stringify(entryPath)} in pack ${this.manifest.packs[pack].uri} (its bytes hash to ${bad})`,
      );
    }
    const bytes =
      'bytes' in held ? held.bytes.subarray(offset, offset + length) : readSpilled(held, hash, offset, length);
    const left = (this.uses.get(pack) ?? 1) - 1;
    this.uses.set(pack, left);
    if (left === 0) this.drop(pack);
    this.dropFarthest();
    return bytes;
  }

  /**
   * Holds no more than PACKS_AHEAD packs decompressed: past them (only the pack the writer needs is
   * loaded beyond them), the loaded pack read again farthest from now is dropped, and downloaded
   * again when it is needed. Files that share chunks far apart (a tree and its copy) would otherwise
   * hold every pack from its first use to its last: the whole checkpoint in memory. A pack is
   * downloaded again once at most: dropped a second time, it is spilled to a file of its own and its
   * chunks read from there to its last use. A file whose chunks cycle through more packs than are held
   * (one a sandbox can make) would otherwise download a pack again for nearly every chunk, or, when
   * such packs were held to their last use, hold every pack it cycles through in memory (a sandbox's
   * crafted file could fill the worker's memory with its whole checkpoint). So a restore downloads
   * each pack twice at most and holds at most PACKS_AHEAD (and the one the writer needs) in memory.
   */
  private dropFarthest(): void {
    while (this.loading.size > PACKS_AHEAD) {
      let farthest: number | undefined;
      let farthestAt = -1;
      for (const pack of this.loading.keys()) {
        // Only a loaded one: one still loading has its download's file in use.
        if (!this.loaded.has(pack)) continue;
        const reads = this.readsOf.get(pack) ?? [];
        const at = reads[reads.length - (this.uses.get(pack) ?? 0)] ?? Infinity;
        if (at > farthestAt) {
          farthest = pack;
          farthestAt = at;
        }
      }
      if (farthest === undefined) return;
      if (this.reloads.has(farthest)) {
        this.spill(farthest);
        continue;
      }
      this.drop(farthest);
      this.fetching.delete(farthest);
      this.reloads.add(farthest);
    }
  }

  /** Moves a loaded pack's bytes from memory to a new file of its own, read from there to its last use. */
  private spill(pack: number): void {
    const { bytes, corrupt } = this.loaded.get(pack)!;
    const file = `${this.tempPrefix}.pack-${pack}.spilled`;
    const fd = fsSync.openSync(file, SPILL_FILE, 0o600);
    try {
      writeAll(fd, bytes, 0);
    } catch (err) {
      fsSync.closeSync(fd);
      fsSync.rmSync(file, { force: true });
      throw err;
    }
    this.loading.delete(pack);
    this.loaded.delete(pack);
    this.spilled.set(pack, { fd, file, corrupt });
    markStage(`pack ${pack} spilled`);
  }

  /** Lets go of a pack held decompressed, or spilled. */
  private drop(pack: number): void {
    this.loading.delete(pack);
    this.loaded.delete(pack);
    this.unspill(pack);
    markStage(`pack ${pack} dropped`);
  }

  /** Closes and removes a spilled pack's file, if it has one. */
  private unspill(pack: number): void {
    const spilled = this.spilled.get(pack);
    if (!spilled) return;
    this.spilled.delete(pack);
    fsSync.closeSync(spilled.fd);
    fsSync.rmSync(spilled.file, { force: true });
  }

  /** Starts loading the first packs the files need. */
  start(): void {
    if (this.order.length > 0) this.fetchAhead(this.order[0]);
  }

  /** Keeps the packs after the one needed now downloading, and it and the next few loading. */
  private fetchAhead(needed: number): void {
    const at = this.rank.get(needed) ?? 0;
    while (this.fetched < this.order.length && this.fetched < at + FETCH_AHEAD) {
      this.fetch(this.order[this.fetched]);
      this.fetched += 1;
    }
    if (this.wanted(needed)) this.load(needed);
    while (this.next < this.order.length && this.loading.size < PACKS_AHEAD) {
      const pack = this.order[this.next];
      this.next += 1;
      if (this.wanted(pack)) this.load(pack);
    }
  }

  /** Whether `pack` is still read and neither loading, loaded nor spilled. */
  private wanted(pack: number): boolean {
    return !this.loading.has(pack) && !this.spilled.has(pack) && (this.uses.get(pack) ?? 0) > 0;
  }

  /** The pack's download to its temporary file, started once (the soonest needed first). */
  private fetch(pack: number): Promise<unknown> {
    let fetching = this.fetching.get(pack);
    if (!fetching) {
      const ref = this.manifest.packs[pack];
      const file = this.fileOf(pack);
      const taken = this.prefetch.take(pack, ref);
      if (taken?.bytes) this.early.set(pack, taken.bytes);
      fetching =
        taken?.done ??
        this.downloading.run(() => this.store.download(ref, file, this.signal, PACK_CHECK), this.rank.get(pack));
      fetching.catch(() => undefined); // awaited by the pack's load, or by close
      this.fetching.set(pack, fetching);
    }
    return fetching;
  }

  /** The pack's temporary file; a pack loaded again gets another (its last download's may not be removed yet). */
  private fileOf(pack: number): string {
    return this.reloads.has(pack) ? `${this.tempPrefix}.pack-${pack}.again` : `${this.tempPrefix}.pack-${pack}`;
  }

  private load(pack: number): void {
    const loading = this.download(pack);
    loading.catch(() => undefined); // awaited by the chunk that needs it
    this.loading.set(pack, loading);
    this.started.add(loading);
  }

  /**
   * Downloads and decompresses a pack, and hashes every chunk of it the manifest names in one go, in
   * the hashing thread: the writer only looks the verdicts up, and hashing overlaps with its writes.
   */
  private async download(pack: number): Promise<LoadedPack> {
    const ref = this.manifest.packs[pack];
    const file = this.fileOf(pack);
    const plain = `${file}.plain`;
    const early = this.early.get(pack);
    this.early.delete(pack);
    try {
      await this.fetch(pack);
      markStage(`pack ${pack} fetched`);
      if (this.closed) return { bytes: Buffer.alloc(0), corrupt: new Map() };
      // A pack downloaded again (dropFarthest) is not progress.
      if (!this.reloads.has(pack)) this.progress.bytes += ref.bytes;
      const bytes = early ? await early : await unpack(file, ref, this.uri, this.rank.get(pack), this.decompressing);
      const chunks = [...(this.chunksOf.get(pack) ?? [])];
      const hashes = await hashSpans(
        bytes,
        chunks.map((hash) => {
          const [, offset, length] = this.manifest.chunks[hash];
          return [offset, offset + length];
        }),
      );
      markStage(`pack ${pack} decompressed and verified`);
      const corrupt = new Map<string, string>();
      chunks.forEach((hash, i) => {
        if (hashes[i] !== hash) corrupt.set(hash, hashes[i]);
      });
      const loaded = { bytes, corrupt };
      this.loaded.set(pack, loaded);
      return loaded;
    } catch (err) {
      if (err instanceof StasisError && err.code === 'NOT_FOUND') {
        throw invalid(this.uri, `needs pack ${ref.uri}, which is missing from the store`);
      }
      throw err;
    } finally {
      await early?.catch(() => undefined);
      await fs.rm(file, { force: true });
      await fs.rm(plain, { force: true });
    }
  }

  /** Drops what is held and waits for the downloads under way; their temporary files go with them. */
  async close(): Promise<void> {
    this.closed = true;
    this.loading.clear();
    this.loaded.clear();
    for (const pack of this.spilled.keys()) this.unspill(pack);
    await Promise.allSettled(this.started);
    // Taken from the prefetch, never loaded (a restore that failed first): its decompression ends first.
    await Promise.allSettled(this.early.values());
    for (const pack of this.early.keys()) await fs.rm(`${this.fileOf(pack)}.plain`, { force: true });
    this.early.clear();
    // Downloaded ahead, never loaded (a restore that failed first): removed here.
    for (const [pack, fetching] of this.fetching) {
      await fetching.catch(() => undefined);
      await fs.rm(this.fileOf(pack), { force: true });
    }
  }
}

/** A spilled pack's file: new (never one already there, nor through a link), ours alone, read back. */
const SPILL_FILE =
  fsSync.constants.O_RDWR | fsSync.constants.O_CREAT | fsSync.constants.O_EXCL | fsSync.constants.O_NOFOLLOW;

/**
 * A chunk of a spilled pack, read from its file. Its bytes were checked before the pack was spilled;
 * they are checked again, as the disk may have changed them (an error to retry: the store's pack is fine).
 */
function readSpilled({ fd, file }: SpilledPack, hash: string, offset: number, length: number): Buffer {
  const bytes = Buffer.allocUnsafe(length);
  for (let at = 0; at < length;) {
    const n = fsSync.readSync(fd, bytes, at, length - at, offset + at);
    if (n === 0) throw new Error(`${file} ended before chunk ${hash}`);
    at += n;
  }
  if (chunkHash(bytes) !== hash) throw new Error(`chunk ${hash} read back from ${file} does not match its hash`);
  return bytes;
}

/** Packs decompressed as soon as the prefetch has them (the first ones the files need). */
const EARLY_PACKS = DECOMPRESSING;

/**
 * A pack's decompressed bytes from its downloaded file: a pack of incompressible chunks (raw blocks)
 * is read as it is; any other goes through zstd, into `<file>.plain` (removed by whoever removes the file).
 */
async function unpack(
  file: string,
  ref: PackRef,
  uri: string,
  rank: number | undefined,
  lanes: Lanes,
): Promise<Buffer> {
  return (
    (await zstdRawFrameFile(file, ref.size)) ??
    (await lanes.run(
      () => zstdDecompressFile(file, `${file}.plain`, ref.size, `pack ${ref.uri} of checkpoint ${uri}`),
      rank,
    ))
  );
}

/**
 * The first packs of a checkpoint, downloaded while its segments are fetched and its manifest is
 * checked (and the sandbox's volume is made): downloaded only, to the file PackReader would download
 * them to; nothing in them is used before the manifest is checked whole and each chunk against its
 * hash. The pack list is in the order the checkpoint wrote the packs, which is the order its files
 * need them, so the first few are the first needed. A pack the manifest's checks refuse (outside the
 * sandbox's packs, too large) is not fetched.
 */
class Prefetch {
  private readonly downloads = new Map<
    number,
    { ref: PackRef; file: string; done: Promise<unknown>; bytes?: Promise<Buffer> }
  >();

  constructor(
    private readonly store: CheckpointStore,
    private readonly uri: string,
    private readonly tempPrefix: string,
    private readonly signal: AbortSignal | undefined,
    private readonly downloading: Lanes,
    private readonly decompressing: Lanes,
  ) {}

  start(packs: PackRef[]): void {
    packs.slice(0, FETCH_AHEAD).forEach((ref, pack) => {
      try {
        checkPackRef(ref, this.uri, packsPrefixOf(this.uri));
      } catch {
        return; // refused by the manifest's checks, with this message, before any pack is read
      }
      const file = `${this.tempPrefix}.pack-${pack}`;
      const done = this.downloading.run(() => this.store.download(ref, file, this.signal, PACK_CHECK), pack);
      done.catch(() => undefined); // awaited by the reader that takes it, or by close
      // The first ones decompressed too (not trusted: the reader hashes them), or the writer waits for that
      // once the manifest is read (~140 ms of a 20,000-file restore, load ~8).
      const bytes =
        pack < EARLY_PACKS ? done.then(() => unpack(file, ref, this.uri, pack, this.decompressing)) : undefined;
      bytes?.catch(() => undefined); // awaited by the reader that takes it, or by close
      this.downloads.set(pack, { ref, file, done, ...(bytes ? { bytes } : {}) });
    });
  }

  /**
   * Pack `pack`'s download if it was started, handed over with its file (PackReader's name for it),
   * and its decompressed bytes if they are on the way.
   */
  take(pack: number, ref: PackRef): { done: Promise<unknown>; bytes?: Promise<Buffer> } | undefined {
    const download = this.downloads.get(pack);
    if (!download) return undefined;
    this.downloads.delete(pack);
    if (download.ref.uri === ref.uri && download.ref.sha256 === ref.sha256) return download;
    // Not the ref the checked manifest has (it has the top object's own): that one, once this is done with the file.
    const settled = Promise.allSettled([download.done, download.bytes]).then(() =>
      fs.rm(`${download.file}.plain`, { force: true }),
    );
    return { done: settled.then(() => this.store.download(ref, download.file, this.signal, PACK_CHECK)) };
  }

  /** Waits for the downloads nobody took, and removes their files. */
  async close(): Promise<void> {
    const left = [...this.downloads.values()];
    this.downloads.clear();
    for (const { done, bytes, file } of left) {
      await Promise.allSettled([done, bytes]);
      await fs.rm(file, { force: true });
      await fs.rm(`${file}.plain`, { force: true });
    }
  }
}
