import { randomBytes } from 'node:crypto';
import * as fsSync from 'node:fs';
import type { BigIntStats } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import type { Checkpoint } from '../../common/schemas';
import { StasisError } from '../../common/errors';
// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore } from '../index';
import { CheckpointChecker, type ArchiveLimits } from '../archive';
import { MAX_PUT_BYTES } from '../keys';
import { LeaseWaits, readWhole, Slicer, walkSandboxSync, type WalkEntry } from '../walk';
import { warmMetadata } from '../warm';
import { nowNs, racyUntilNs, type Baseline } from './baseline';
import { chunkHash, cutAndHash, hashRanges, hashSpans, INLINE_HASH_BYTES, type Chunked } from './hasher';
import {
  admitEntry,
  encodeTop,
  MANIFEST_SUFFIX,
  MAX_PACK_BYTES,
  MANIFEST_JSON_BYTES_PER_ENTRY,
  manifestJsonBudget,
  PACK_BYTES,
  PACKS_DIR,
  PACK_SUFFIX,
  isManifestEntry,
  isSplitFormat,
  packsPrefixOf,
  splitFormat,
  storedMtime,
  type ChunkPlace,
  type Manifest,
  type ManifestEntry,
  type PackRef,
  type TopManifest,
} from './manifest';
import { CHUNK_SIZES } from './fastcdc';
import { Lanes } from './lanes';
import { SegmentUploads } from './segment-uploads';
import { Slab, Slabs } from './slabs';
import { looksIncompressible, zstdCompressFile, zstdRawFrame } from './zstd';

// Taking a content-addressed checkpoint: walk, find what changed since the
// baseline, cut and hash only that, upload only chunks the baseline's checkpoint
// does not already hold (in packs of a few MiB), and the manifest's segments the
// baseline's checkpoint does not already have (each as soon as its entries and
// their packs are), then last the top object. Until it is in the store nothing
// names the new packs and segments, and a killed attempt leaves only objects that
// garbage collection removes.

/** Files smaller than this are one chunk; larger ones are cut by FastCDC. */
export const WHOLE_FILE_BYTES = 1024 * 1024;
/** Packs uploading at once: with 2, the walk waited on the store and zstd in turn. */
const UPLOADS_IN_FLIGHT = 4;
/** zstd processes at once (each uses one core). */
const COMPRESSING = 2;
/** Packs sealed and not yet stored (on disk, in the temp files) before the walk waits for one. */
const PACKS_QUEUED = 8;
/** Bytes of a large file read (and cut) at once. */
const READ_BYTES = 8 * 1024 * 1024;
/** Unused read buffers kept for reuse, of each size (see slabs.ts). */
const SLABS_KEPT = 4;

/**
 * Takes a chunk of a file; `slab`, if given, is the buffer its bytes are a view of, which the
 * callee holds (Slab.hold) for as long as it keeps the view past the call.
 */
type OnChunk = (hash: string, bytes: Buffer, slab?: Slab) => Promise<void> | undefined;

export interface TakeStats {
  files: number;
  /** Files read and hashed (the rest kept their chunks from the baseline). */
  filesHashed: number;
  /** Compressed bytes of the packs uploaded. */
  packBytes: number;
  packs: number;
  /** Of `packs`, those of incompressible chunks, stored as raw blocks (not through zstd). */
  rawPacks: number;
  /** Manifest segments uploaded (the rest were the baseline's), their stored bytes, and the top object's. */
  segments: number;
  segmentBytes: number;
  topBytes: number;
}

/** Stats of `files` files before anything was hashed or sent. */
function noStats(files: number): TakeStats {
  return { files, filesHashed: 0, packBytes: 0, packs: 0, rawPacks: 0, segments: 0, segmentBytes: 0, topBytes: 0 };
}

export async function takeCheckpoint(input: {
  store: CheckpointStore;
  rootDir: string;
  names: readonly string[];
  /** `checkpoints/<sandboxId>/` */
  prefix: string;
  /** The manifest's name in the prefix (without its ending), unique per release request. */
  name: string;
  labels: Record<string, string>;
  limits: ArchiveLimits;
  baseline?: Baseline;
  progress: { bytes: number };
  /** Packs are compressed through files named `${tempPrefix}.*` (default: in the OS's temp directory); all removed before this returns. */
  tempPrefix?: string;
  signal?: AbortSignal;
}): Promise<{ checkpoint: Checkpoint; baseline: Baseline; stats: TakeStats }> {
  const { signal } = input;
  const tempPrefix = input.tempPrefix ?? path.join(os.tmpdir(), `stasis-pack-${randomBytes(6).toString('hex')}`);
  // Ahead of the walk, from now (the baseline's check is a round trip to the store) until it is over.
  const { stop: stopWarming } = warmMetadata(input.rootDir, input.names);
  let baseline: Baseline | undefined;
  try {
    baseline = await usableBaseline(input.store, input.baseline, input.prefix);
  } catch (err) {
    stopWarming();
    throw err;
  }
  const takenAtNs = nowNs();
  const checker = new CheckpointChecker(input.limits);
  const packer = new Packer(input.store, `${input.prefix}${PACKS_DIR}`, input.name, tempPrefix, input.progress, signal);
  const known = knownChunks(baseline);
  const entries: ManifestEntry[] = [];
  const local: Baseline['local'] = {};
  const stats = noStats(0);
  const onChunk: OnChunk = (hash, bytes, slab) => (known.has(hash) ? undefined : packer.add(hash, bytes, slab));
  const locate = (hash: string): ChunkPlace | undefined => packer.located(hash) ?? known.get(hash);
  const segments = new SegmentUploads(input, locate, baseline);
  // A pack that failed fails the checkpoint: segments still waiting to be put would be named by nothing.
  packer.onFailure = (err) => segments.stop(err);
  // The entries before `ready` went to the segments; of entries[ready], the chunks before `readyChunks` are located.
  let ready = 0;
  let readyChunks = 0;
  /** Gives the segments every entry now complete, in order: a file once each of its chunks is located. */
  const advance = () => {
    for (; ready < entries.length; ready += 1, readyChunks = 0) {
      const entry = entries[ready];
      if (entry.k === 'f') {
        const chunks = entry.c;
        if (chunks === undefined) return;
        for (; readyChunks < chunks.length; readyChunks += 1) {
          const hash = chunks[readyChunks];
          if (packer.located(hash) === undefined && !known.has(hash)) return;
        }
      }
      // What restore reads, checked as it checks it: a writer and a reader that disagree (an mtime
      // before 1970 once) fail the release, which keeps compute, rather than store what never restores.
      if (!isManifestEntry(entry as unknown)) {
        throw new StasisError(
          'CHECKPOINT_INVALID',
          `${entry.p}: its entry is not one a restore reads (${JSON.stringify(entry)})`,
        );
      }
      segments.add(entry);
    }
  };
  // This checkpoint's own: none is kept past it.
  const pieces = new Slabs(CHUNK_SIZES.max + READ_BYTES, SLABS_KEPT);
  const smallFiles = new SmallFiles(onChunk, new Slabs(BATCH_BYTES, SLABS_KEPT));
  /** Files the baseline vouched for, each with the baseline's own entry. */
  let kept = 0;
  try {
    // A file the baseline vouches for is never opened: only its lstat is taken. Its entry and local
    // facts are the baseline's, kept for the loop below (asking the baseline twice a file was ~10% of
    // an unchanged re-suspend): the walk yields a file it was told not to open right after asking.
    let vouched: Unchanged | undefined;
    const previous = baseline && new BaselineEntries(baseline);
    const wants = (entryPath: string, stat: BigIntStats) => {
      vouched = previous && unchangedFile(previous, entryPath, stat);
      return vouched === undefined;
    };
    // Synchronous unless it must wait (a file to read, a turn of the event loop): an unchanged file costs no promise.
    const slicer = new Slicer();
    // Without a baseline every file is read, and the walk then opens a regular file without an lstat first.
    const leases = new LeaseWaits(input.rootDir, input.names);
    for (const walked of await walkSandboxSync(input.rootDir, input.names, previous ? { wants } : {})) {
      if (slicer.due()) await slicer.turn();
      signal?.throwIfAborted();
      if (walked.kind === 'leased') {
        // The walk tries the file again when asked for its next entry.
        await leases.wait(walked.path, signal);
        continue;
      }
      advance();
      if (walked.kind === 'file' && walked.file === undefined) {
        // Not opened: the baseline vouched for it, and its entry is what describe would make of it.
        const unchanged = vouched?.entry.p === walked.path ? vouched : undefined;
        vouched = undefined;
        if (!unchanged) throw new Error(`${walked.path} was not opened, yet its baseline does not hold it`);
        // Restore's own rules still count it (entries, bytes); its mode is already as they admit it.
        admitEntry(checker, unchanged.entry);
        stats.files += 1;
        kept += 1;
        local[walked.path] = unchanged.here;
        entries.push(unchanged.entry);
        continue;
      }
      const entry = describe(walked);
      // Restore's own rules: a release never terminates compute for a checkpoint no restore would take.
      entry.m = admitEntry(checker, entry).mode;
      if (walked.kind === 'file' && walked.file !== undefined) {
        // Opened, it is read whatever its stat says now.
        stats.files += 1;
        stats.filesHashed += 1;
        if (entry.s > 0 && entry.s < WHOLE_FILE_BYTES) await smallFiles.add(entry, walked.file, walked.path);
        else {
          // The small files before it are packed first: packs hold chunks in walk order, whatever the timing.
          await smallFiles.finish();
          entry.c = await chunkFile(walked, entry.s, onChunk, pieces);
        }
        local[entry.p] = [walked.stat.ino.toString(), walked.stat.ctimeNs.toString()];
      }
      entries.push(entry);
    }
    stopWarming();
    checker.finish();
    await smallFiles.finish();
    await packer.sealAll();
    advance();
    if (ready !== entries.length) throw new Error(`${entries[ready].p} has chunks in no pack`);
  } catch (err) {
    stopWarming();
    await smallFiles.abandon();
    await packer.abandon();
    await segments.abandon();
    throw err;
  }
  // Every file kept the baseline's chunk list, and the baseline has no other file: the chunks are the
  // baseline's, located where it locates them (looking each up again was ~5% of an unchanged re-suspend).
  const assembled: Manifest =
    baseline && kept === stats.files && kept === filesOf(baseline)
      ? {
          format: 'stasis-cas-2',
          takenAtNs: takenAtNs.toString(),
          entries,
          chunks: baseline.manifest.chunks,
          packs: baseline.manifest.packs,
        }
      : assemble(takenAtNs.toString(), entries, known, packer);
  // The segments (which name packs by name, known once sealed) are stored while the last packs still
  // upload, and only the top object (their sizes and hashes) waits for them.
  let stored: { checkpoint: Checkpoint; manifest: Manifest };
  try {
    stored = await storeManifest(input, assembled, segments, stats, packer.finish());
  } catch (err) {
    await packer.abandon();
    await segments.abandon();
    throw err;
  }
  const { checkpoint, manifest } = stored;
  // Every entry went through `checker` in the walk above, which would have refused it otherwise.
  admitted.set(manifest, input.limits);
  stats.segments = segments.uploaded;
  stats.segmentBytes = segments.uploadedBytes;
  stats.packBytes = packer.uploadedBytes;
  stats.packs = packer.uploadedPacks;
  stats.rawPacks = packer.rawPacks;
  return {
    checkpoint,
    baseline: { uri: checkpoint.uri, takenAtNs: takenAtNs.toString(), manifest, local, split: true },
    stats,
  };
}

/**
 * Stores the manifest as `stasis-cas-2`: its segments (SegmentUploads, which has every entry), then,
 * once the packs are stored too, the top object, last.
 */
async function storeManifest(
  input: {
    store: CheckpointStore;
    prefix: string;
    name: string;
    labels: Record<string, string>;
    limits: ArchiveLimits;
    signal?: AbortSignal;
  },
  manifest: Manifest,
  segments: SegmentUploads,
  stats: TakeStats,
  /** The packs' uploads: the top object, which holds their sizes and hashes, is stored once they are. */
  packed: Promise<void>,
): Promise<{ checkpoint: Checkpoint; manifest: Manifest }> {
  // Either failing fails the checkpoint at once (a failed pack has stopped the segments not yet put).
  const [refs] = await Promise.all([segments.finish(), packed]);
  const format = splitFormat(manifest.entries);
  const top: TopManifest = {
    format,
    takenAtNs: manifest.takenAtNs,
    segments: refs,
    packs: manifest.packs,
  };
  // What a restore would read, checked before the top object makes the checkpoint one (readManifest).
  const jsonBytes = Buffer.byteLength(JSON.stringify(top)) + refs.reduce((sum, [, , json]) => sum + json, 0);
  const budget = manifestJsonBudget(input.limits);
  if (jsonBytes > budget)
    throw new StasisError(
      'CHECKPOINT_INVALID',
      `the checkpoint's manifest would be ${jsonBytes} bytes of JSON, above the ${budget} a restore reads (${input.limits.maxEntries} entries × ${MANIFEST_JSON_BYTES_PER_ENTRY}): long names or link targets, most of them not UTF-8, take that much`,
    );
  const checkpoint = await storeTop(input, top, stats);
  return { checkpoint, manifest: { ...manifest, format, segments: refs } };
}

/** Stores the top object, the last of a checkpoint: from then on it names its segments and packs. */
async function storeTop(
  input: { store: CheckpointStore; prefix: string; name: string; labels: Record<string, string>; signal?: AbortSignal },
  top: TopManifest,
  stats: TakeStats,
): Promise<Checkpoint> {
  const { signal } = input;
  const body = encodeTop(top);
  stats.topBytes = body.length;
  const key = `${input.prefix}${input.name}${MANIFEST_SUFFIX}`;
  // Streamed only past what one request takes (a workspace of terabytes): put ends what a killed attempt left open.
  try {
    return body.length <= MAX_PUT_BYTES
      ? await input.store.putBytes(key, body, input.labels, signal)
      : await input.store.put(key, Readable.from([body]), input.labels, signal);
  } catch (err) {
    // The top object is this release's alone (its key is fixed per release request), unlike packs and
    // segments: one stored although its answer was lost or cancelled is a checkpoint nobody records.
    await input.store.delete(input.store.uriOf(key)).catch(() => undefined);
    throw err;
  }
}

/**
 * A checkpoint of files known to be exactly the baseline's (the caller proved nothing changed on
 * their volume since the baseline was the files): a new top object naming the baseline's segments
 * and packs, with no walk and nothing read or uploaded but it. Undefined when the baseline cannot
 * be reused (not this engine's split manifest, or its checkpoint is gone) or the proof fails: the
 * caller then walks, and no top object of this release is left in the store.
 */
export async function repeatCheckpoint(input: {
  store: CheckpointStore;
  /** `checkpoints/<sandboxId>/` */
  prefix: string;
  name: string;
  labels: Record<string, string>;
  limits: ArchiveLimits;
  baseline: Baseline;
  /**
   * A cheap first sign, settling before `unchanged`: once it is true the top object is stored while
   * `unchanged` and the baseline's checkpoint are still looked for (and deleted if either fails); false
   * stores nothing. The top object's PUT was ~4-5 ms of a ~20 ms unchanged re-suspend of 64 MiB, after
   * the proof's sync and the HEAD; beside them it costs no time.
   */
  likely: Promise<boolean>;
  /** The caller's proof that the files are still the baseline's, looked for meanwhile: false, nothing is stored. */
  unchanged: Promise<boolean>;
  signal?: AbortSignal;
}): Promise<{ checkpoint: Checkpoint; baseline: Baseline; stats: TakeStats } | undefined> {
  const { manifest } = input.baseline;
  if (!input.baseline.split || !isSplitFormat(manifest.format) || !manifest.segments) return undefined;
  // Only a live checkpoint keeps its segments and packs from garbage collection (a round trip, beside the proof's).
  const usable = usableBaseline(input.store, input.baseline, input.prefix);
  usable.catch(() => undefined); // awaited below
  // Restore's own rules, as a walk applies them (the limits are the worker's, which may have changed since).
  // A refusal counts only if the files are the baseline's: otherwise the walk decides on the files as they are.
  let refused: unknown;
  if (!admittedUnder(manifest, input.limits)) {
    const checker = new CheckpointChecker(input.limits);
    try {
      for (const entry of manifest.entries) admitEntry(checker, entry);
      checker.finish();
      admitted.set(manifest, input.limits);
    } catch (err) {
      refused = err;
    }
  }
  let files = 0;
  for (const entry of manifest.entries) if (entry.k === 'f') files += 1;
  const stats = noStats(files);
  const top: TopManifest = {
    // The baseline's own (splitFormat made it when it was stored): the same entries need the same readers.
    format: manifest.format,
    takenAtNs: manifest.takenAtNs,
    segments: manifest.segments,
    packs: manifest.packs,
  };
  const stored = input.likely.then((likely) =>
    likely && refused === undefined ? storeTop(input, top, stats) : undefined,
  );
  stored.catch(() => undefined); // awaited below
  let proven: boolean;
  try {
    const [baseline, unchanged] = await Promise.all([usable, input.unchanged]);
    proven = baseline !== undefined && unchanged;
  } catch (err) {
    await discard(input.store, stored);
    throw err;
  }
  if (!proven) {
    // Never left behind: it would be a checkpoint of files that may no longer be these (the walk's, under
    // the same key, replaces it; one left by a killed worker is named by no receipt).
    await discard(input.store, stored);
    return undefined;
  }
  if (refused !== undefined) throw refused;
  const checkpoint = (await stored) ?? (await storeTop(input, top, stats));
  return { checkpoint, baseline: { ...input.baseline, uri: checkpoint.uri }, stats };
}

/**
 * Manifests whose every entry this process admitted by restore's rules (a walk, or a repeat that checked
 * them), with the limits of that time: a repeat under the same limits does not check them again (~30 ms
 * of an unchanged re-suspend's ~40 at 20,000 entries). Kept per process, never with the baseline on disk:
 * a baseline read by a later version, whose rules may be stricter, is checked by those rules once.
 */
const admitted = new WeakMap<Manifest, ArchiveLimits>();

function admittedUnder(manifest: Manifest, limits: ArchiveLimits): boolean {
  const before = admitted.get(manifest);
  return before !== undefined && before.maxBytes === limits.maxBytes && before.maxEntries === limits.maxEntries;
}

/** Deletes the top object `stored` put, once its PUT has settled (a failed one deleted its own). */
async function discard(store: CheckpointStore, stored: Promise<Checkpoint | undefined>): Promise<void> {
  const checkpoint = await stored.catch(() => undefined);
  if (checkpoint) await store.delete(checkpoint.uri).catch(() => undefined);
}

function describe(walked: WalkEntry): ManifestEntry {
  const { stat } = walked;
  if (walked.kind === 'leased') throw new Error(`${walked.path}: a leased file is waited for, never described`);
  const kind = ({ directory: 'd', file: 'f', symlink: 'l', hardlink: 'h' } as const)[walked.kind];
  return {
    p: walked.path,
    k: kind,
    m: Number(stat.mode & 0o7777n),
    s: walked.kind === 'file' ? Number(stat.size) : 0,
    // Nothing of this host's (a ctime, an inode) goes in the entry: it is in every segment, and a restore
    // on another host must find the same entries again (the local baseline keeps the host's facts).
    mt: storedMtime(stat.mtimeNs),
    ...(walked.linkpath !== undefined ? { l: walked.linkpath } : {}),
  };
}

/**
 * The baseline if its checkpoint and every pack it names are this sandbox's own (a manifest naming
 * another sandbox's packs is refused by restore, and those packs are not kept alive for this one), and
 * its checkpoint still exists: only a live manifest keeps its packs from garbage collection, so the
 * chunks of a deleted checkpoint may be gone and are uploaded again.
 */
async function usableBaseline(
  store: CheckpointStore,
  baseline: Baseline | undefined,
  prefix: string,
): Promise<Baseline | undefined> {
  if (!baseline) return undefined;
  const packs = packsPrefixOf(baseline.uri);
  const own = packs.endsWith(`/${prefix}${PACKS_DIR}`) && baseline.manifest.packs.every((p) => p.uri.startsWith(packs));
  return own && (await store.exists(baseline.uri)) ? baseline : undefined;
}

/** The chunks the baseline's checkpoint holds (reused without upload), looked up in its manifest. */
interface Known {
  has(hash: string): boolean;
  get(hash: string): ChunkPlace | undefined;
}

/** The baseline's chunks, read where its manifest holds them: a map of them all cost ~45 ms a suspend at 20,000 files. */
function knownChunks(baseline: Baseline | undefined): Known {
  if (!baseline) return { has: () => false, get: () => undefined };
  const { chunks, packs } = baseline.manifest;
  return {
    has: (hash) => Object.hasOwn(chunks, hash),
    get: (hash) => {
      if (!Object.hasOwn(chunks, hash)) return undefined;
      const [pack, offset, length] = chunks[hash];
      return { pack: packs[pack], offset, length };
    },
  };
}

/** A file the baseline vouches for: its entry (with its chunks) and local facts, as this walk would make them. */
interface Unchanged {
  entry: ManifestEntry;
  here: [string, string];
}

/** What the baseline holds of this file if it certainly did not change since; undefined if it must be read. */
function unchangedFile(baseline: BaselineEntries, entryPath: string, stat: BigIntStats): Unchanged | undefined {
  if ((Number(stat.mode) & fsSync.constants.S_IFMT) !== fsSync.constants.S_IFREG) return undefined;
  const previous = baseline.get(entryPath);
  const here = baseline.local[entryPath];
  if (!previous || previous.k !== 'f' || !here || !previous.c) return undefined;
  // Changed in the same clock tick (or whole second) as the baseline's stat: its stat cannot tell (git's racy rule).
  if (racyUntilNs(stat.ctimeNs) >= baseline.takenAtNs) return undefined;
  const same =
    previous.s === Number(stat.size) &&
    // The mode as the checkpoint rules admit it (setuid and setgid stripped), as the manifest holds it.
    previous.m === (Number(stat.mode) & 0o1777) &&
    here[1] === stat.ctimeNs.toString() &&
    here[0] === stat.ino.toString() &&
    previous.mt === storedMtime(stat.mtimeNs);
  if (!same) return undefined;
  // Field for field what describe makes (a ctime, as earlier versions wrote it, left out): shared, never modified.
  if (previous.ct === undefined && previous.l === undefined) return { entry: previous, here };
  const { ct: _ct, l: _l, ...entry } = previous;
  return { entry, here };
}

/** Entries looked at past the last one found before a path is looked up by map (directories lie between files). */
const LOOKAHEAD = 8;

/**
 * A baseline's entries by path, for one walk. The walk's order is the baseline's (it was a walk too, or
 * a restore of one), so the entry asked for is nearly always a few past the last one found: an
 * unchanged re-suspend then never builds the map of every path (~5% of it at 20,000 files).
 */
class BaselineEntries {
  private next = 0;
  private readonly entries: ManifestEntry[];
  readonly local: Baseline['local'];
  /** When the baseline's stats were taken: a ctime racy until then tells nothing (racyUntilNs). */
  readonly takenAtNs: bigint;

  constructor(private readonly baseline: Baseline) {
    this.entries = baseline.manifest.entries;
    this.local = baseline.local;
    this.takenAtNs = BigInt(baseline.takenAtNs);
  }

  get(entryPath: string): ManifestEntry | undefined {
    const { entries } = this;
    for (let i = this.next, end = Math.min(entries.length, this.next + LOOKAHEAD); i < end; i += 1) {
      if (entries[i].p === entryPath) {
        this.next = i + 1;
        return entries[i];
      }
    }
    const i = positionsOf(this.baseline).get(entryPath);
    if (i === undefined) return undefined;
    this.next = i + 1;
    return entries[i];
  }
}

/** Each path's position in a baseline's entries, made once per baseline, when first needed. */
const positions = new WeakMap<Baseline, Map<string, number>>();
function positionsOf(baseline: Baseline): Map<string, number> {
  let found = positions.get(baseline);
  if (!found) {
    found = new Map(baseline.manifest.entries.map((entry, i) => [entry.p, i]));
    positions.set(baseline, found);
  }
  return found;
}

/** How many files with chunks a baseline has. */
function filesOf(baseline: Baseline): number {
  let files = 0;
  for (const entry of baseline.manifest.entries) if (entry.k === 'f' && entry.c) files += 1;
  return files;
}

/**
 * Reads a file once, cuts and hashes it, hands each chunk to `onChunk`; returns its chunk hashes.
 * A large file's next piece is read while the hashing thread cuts the one before.
 */
async function chunkFile(walked: WalkEntry, size: number, onChunk: OnChunk, pieces: Slabs): Promise<string[]> {
  const file = walked.file;
  if (file === undefined || size === 0) return [];
  if (size < WHOLE_FILE_BYTES) {
    const bytes = readWhole(file, size, walked.path, 0, size < INLINE_HASH_BYTES ? undefined : shared(size));
    const [hash] = (await hashRanges(bytes, [bytes.length])).hashes;
    await onChunk(hash, bytes);
    return [hash];
  }
  const hashes: string[] = [];
  // Each piece is read into shared memory (the hashing thread sees it without a copy) after room for
  // the bytes the previous cut left over, which are copied in front of it once that cut is known.
  const room = CHUNK_SIZES.max;
  type Piece = { slab: Slab; bytes: Buffer };
  const readPiece = (position: number): Piece => {
    const length = Math.min(READ_BYTES, size - position);
    const slab = pieces.take();
    const bytes = slab.buffer.subarray(0, room + length);
    readWhole(file, length, walked.path, position, bytes.subarray(room));
    return { slab, bytes };
  };
  let read = 0;
  /** Sends a piece, after the bytes the previous cut left over, to the hashing thread. */
  const cut = ({ slab, bytes: piece }: Piece, carry: Buffer): Cutting => {
    read += piece.length - room;
    if (carry.length > room) throw new Error(`FastCDC left ${carry.length} bytes uncut, more than its largest chunk`);
    carry.copy(piece, room - carry.length);
    const data = piece.subarray(room - carry.length);
    const cutting = cutAndHash(data, read === size);
    cutting.catch(() => undefined); // awaited in its turn
    return { slab, data, cutting };
  };
  type Cutting = { slab: Slab; data: Buffer; cutting: Promise<Chunked> };
  let current: Cutting | undefined = cut(readPiece(0), Buffer.alloc(0));
  while (current) {
    const { slab, data, cutting }: Cutting = current;
    const next = read < size ? readPiece(read) : undefined;
    const { ends, hashes: cuts }: Chunked = await cutting;
    // The next piece goes to the hashing thread before this one's chunks are packed: it cuts while they wait.
    current = next ? cut(next, data.subarray(ends.at(-1) ?? 0)) : undefined;
    let start = 0;
    for (let i = 0; i < ends.length; i += 1) {
      await onChunk(cuts[i], data.subarray(start, ends[i]), slab);
      hashes.push(cuts[i]);
      start = ends[i];
    }
    // Cut and hashed (the thread is done with it), its carry copied on, its chunks held where kept.
    slab.release();
  }
  return hashes;
}

/** Bytes of small files read into one batch before it goes to the hashing thread. */
const BATCH_BYTES = 4 * 1024 * 1024;

/**
 * Files under WHOLE_FILE_BYTES (one chunk each), read into a shared batch and hashed in the
 * hashing thread a batch at a time while the walk fills the next one: hashed in place, tens of
 * thousands of them kept the event loop, the walk's one thread, busy hashing. Each entry gets its
 * chunk hash, and its chunk goes to the packer, when its batch comes back (batches in walk order).
 */
class SmallFiles {
  /** Taken when the first file comes: zeroed shared memory costs ~7 ms, for nothing when no file is read. */
  private slab?: Slab;
  private used = 0;
  private pending: { entry: ManifestEntry; start: number; end: number }[] = [];
  /** The batch in the hashing thread (and then packed), if any. */
  private inFlight: Promise<void> = Promise.resolve();

  constructor(
    private readonly onChunk: OnChunk,
    private readonly batches: Slabs,
  ) {}

  async add(entry: ManifestEntry, file: number, entryPath: string): Promise<void> {
    if (this.used + entry.s > BATCH_BYTES) await this.flush();
    this.slab ??= this.batches.take();
    const start = this.used;
    readWhole(file, entry.s, entryPath, 0, this.slab.buffer.subarray(start, start + entry.s));
    this.pending.push({ entry, start, end: start + entry.s });
    this.used += entry.s;
  }

  async finish(): Promise<void> {
    await this.flush();
    await this.inFlight;
  }

  /** Waits for the batch under way, so nothing is still packing once the attempt has failed. */
  async abandon(): Promise<void> {
    await this.inFlight.catch(() => undefined);
  }

  /** Sends the batch being filled; returns once the batch before it is packed (one batch in the thread at a time). */
  private async flush(): Promise<void> {
    const { slab, pending } = this;
    if (pending.length === 0 || !slab) return;
    const { buffer } = slab;
    const hashing = hashSpans(
      buffer.subarray(0, this.used),
      pending.map(({ start, end }) => [start, end]),
    );
    hashing.catch(() => undefined); // awaited in its turn below
    this.slab = undefined;
    this.used = 0;
    this.pending = [];
    const previous = this.inFlight;
    this.inFlight = (async () => {
      await previous;
      const hashes = await hashing;
      for (let i = 0; i < pending.length; i += 1) {
        const { entry, start, end } = pending[i];
        entry.c = [hashes[i]];
        await this.onChunk(hashes[i], buffer.subarray(start, end), slab);
      }
      // Hashed, and its chunks held where kept.
      slab.release();
    })();
    this.inFlight.catch(() => undefined); // awaited by the next flush, finish or abandon
    await previous;
  }
}

/** A buffer in shared memory: posted to the hashing thread, it is shared, not copied. */
function shared(size: number): Buffer {
  return Buffer.from(new SharedArrayBuffer(size));
}

/** The manifest: every chunk its files name, located in the baseline's packs or the new ones. */
function assemble(takenAtNs: string, entries: ManifestEntry[], known: Known, packer: Packer): Manifest {
  const packs: PackRef[] = [];
  const packIndex = new Map<string, number>();
  const chunks: Manifest['chunks'] = {};
  for (const entry of entries) {
    for (const hash of entry.c ?? []) {
      if (chunks[hash]) continue;
      const where = packer.located(hash) ?? known.get(hash);
      if (!where) throw new Error(`chunk ${hash} of ${entry.p} was neither uploaded nor in the previous checkpoint`);
      let index = packIndex.get(where.pack.uri);
      if (index === undefined) {
        index = packs.push(where.pack) - 1;
        packIndex.set(where.pack.uri, index);
      }
      chunks[hash] = [index, where.offset, where.length];
    }
  }
  return { format: 'stasis-cas-2', takenAtNs, entries, chunks, packs };
}

/** A pack being filled: its chunks in order, their hashes, and its size. */
interface OpenPack {
  parts: Buffer[];
  hashes: string[];
  size: number;
  /** By part, the slab it is a view of (held once for it), until the part is copied out. */
  slabs: (Slab | undefined)[];
  /** Slabs held (a slab's chunks come one after another), and the last one. */
  held: number;
  last?: Slab;
}

const openPack = (): OpenPack => ({ parts: [], hashes: [], size: 0, slabs: [], held: 0 });

/**
 * Slabs an open pack holds at most. A pack of one kind of chunk spans at most 4 (its 8 MiB and last chunk over
 * batches of 4 MiB); one that takes a few bytes of each (a tiny text file in each batch of random ones) held
 * them all, as many as the workspace had: 256 MiB of files read kept ~300 MiB in memory until the pack was sealed.
 */
const HELD_SLABS = 4;

/** Copies out the parts of `pack` that are views of slabs, and releases those. Each byte is copied at most once. */
function copyOut(pack: OpenPack): void {
  pack.slabs.forEach((slab, i) => {
    if (!slab) return;
    pack.parts[i] = Buffer.from(pack.parts[i]);
    pack.slabs[i] = undefined;
    slab.release();
  });
  pack.held = 0;
  pack.last = undefined;
}

/**
 * Groups new chunks into packs, compresses (zstd) and uploads them. The stages overlap: a sealed pack
 * goes to its file at once (its chunks' memory is then free), at most COMPRESSING zstd run and
 * UPLOADS_IN_FLIGHT puts, and the walk goes on cutting and hashing until PACKS_QUEUED packs wait.
 * With one bound on all three (4 packs each written, compressed and put in turn), the walk and the
 * hashing thread stood still whenever four puts were waiting on the store.
 *
 * Chunks that look incompressible (random, already compressed: looksIncompressible) fill packs of
 * their own, stored as a zstd frame of raw blocks built here: zstd -1 gains nothing on them, and they
 * were the larger part of a mixed workspace's temp file writes, reads and zstd time.
 */
class Packer {
  private compressible = openPack();
  private raw = openPack();
  private readonly pendingChunks = new Map<string, { offset: number; length: number; slot: number }>();
  /** Each sealed pack's reference, by slot: its uri at once, its stored bytes and sha-256 once uploaded. */
  private readonly sealed: PackRef[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  /** Raw packs sealed and not yet stored: each is held in memory until then. */
  private readonly rawInFlight = new Set<Promise<void>>();
  private readonly compressing = new Lanes(COMPRESSING);
  private readonly putting = new Lanes(UPLOADS_IN_FLIGHT);
  /** Raw packs' frames, reused: at most UPLOADS_IN_FLIGHT are sealed and not yet stored, and one more being sealed. */
  private readonly frames = new Slabs(RAW_FRAME_BYTES, UPLOADS_IN_FLIGHT + 1);
  private failure: unknown;
  /** Told of the first pack that failed, when it fails. */
  onFailure?: (err: unknown) => void;
  uploadedBytes = 0;
  uploadedPacks = 0;
  /** Of uploadedPacks, those stored as raw blocks. */
  rawPacks = 0;

  constructor(
    private readonly store: CheckpointStore,
    private readonly packsKey: string,
    private readonly attempt: string,
    private readonly tempPrefix: string,
    private readonly progress: { bytes: number },
    private readonly signal: AbortSignal | undefined,
  ) {}

  async add(hash: string, bytes: Buffer, slab?: Slab): Promise<void> {
    if (this.pendingChunks.has(hash)) return;
    const raw = looksIncompressible(bytes);
    const pack = raw ? this.raw : this.compressible;
    // Its slot is known once its pack is sealed.
    this.pendingChunks.set(hash, { offset: pack.size, length: bytes.length, slot: -1 });
    if (slab && slab !== pack.last) {
      if (pack.held >= HELD_SLABS) copyOut(pack);
      pack.held += 1;
      pack.last = slab;
    }
    slab?.hold();
    pack.slabs.push(slab);
    pack.parts.push(bytes);
    pack.hashes.push(hash);
    pack.size += bytes.length;
    if (pack.size >= PACK_BYTES) await this.seal(raw);
  }

  /**
   * Where a chunk of a sealed pack is. The pack's reference has its uri from the moment it is sealed;
   * its stored size and sha-256 only once it is uploaded (finish).
   */
  located(hash: string): { pack: PackRef; offset: number; length: number } | undefined {
    const where = this.pendingChunks.get(hash);
    const pack = where && this.sealed[where.slot];
    return where && pack ? { pack, offset: where.offset, length: where.length } : undefined;
  }

  /** Seals the packs being filled: every chunk added is then located. */
  async sealAll(): Promise<void> {
    if (this.compressible.size > 0) await this.seal(false);
    if (this.raw.size > 0) await this.seal(true);
  }

  /** Waits for every sealed pack's upload: their references are then complete. */
  async finish(): Promise<void> {
    await this.sealAll();
    await Promise.all(this.inFlight);
    if (this.failure !== undefined) throw this.failure;
  }

  /** Waits for the uploads under way, so nothing is still writing once the attempt has failed. */
  async abandon(): Promise<void> {
    await Promise.allSettled(this.inFlight);
  }

  private async seal(raw: boolean): Promise<void> {
    const slot = this.sealed.length;
    const { parts, hashes, size, slabs } = raw ? this.raw : this.compressible;
    if (raw) this.raw = openPack();
    else this.compressible = openPack();
    // Named by its release request and the chunks it holds: a retry of the request that packs the same
    // chunks rewrites its own object, and never one another checkpoint names (a failed put removes its key).
    const name = chunkHash(Buffer.from(`${this.attempt}\n${hashes.join('')}`));
    // Its stored bytes and sha-256 are filled in by its put; nothing reads them before finish.
    this.sealed.push({ uri: this.store.uriOf(this.keyOf(name)), sha256: '', bytes: 0, size });
    for (const hash of hashes) this.pendingChunks.get(hash)!.slot = slot;
    while (this.inFlight.size >= PACKS_QUEUED || (raw && this.rawInFlight.size >= UPLOADS_IN_FLIGHT))
      await Promise.race(raw && this.rawInFlight.size >= UPLOADS_IN_FLIGHT ? this.rawInFlight : this.inFlight);
    if (this.failure !== undefined) throw this.failure;
    let upload: Promise<void>;
    if (raw) {
      // One copy, so the buffers the chunks were read into (pieces of files, batches of small files) are
      // free: into a reused frame buffer (a new one each pack was ~5% of the main thread, and its garbage more).
      const frameParts = zstdRawFrame(parts, size);
      const length = frameParts.reduce((sum, part) => sum + part.length, 0);
      const frame = length <= this.frames.size ? this.frames.take() : undefined;
      const bytes = frame ? copyInto(frameParts, frame.buffer.subarray(0, length)) : Buffer.concat(frameParts, length);
      for (const slab of slabs) slab?.release();
      upload = this.uploadRaw(slot, name, bytes, frame);
    } else {
      const plain = `${this.tempPrefix}.${slot}`;
      // File to file: the chunks go to the disk cache in a few writev calls, and zstd's output comes back in one read.
      try {
        writeParts(plain, parts, size);
      } catch (err) {
        fsSync.rmSync(plain, { force: true });
        throw err;
      }
      for (const slab of slabs) slab?.release();
      upload = this.upload(slot, name, plain);
    }
    const settled = upload.then(
      () => {
        this.inFlight.delete(settled);
        this.rawInFlight.delete(settled);
      },
      (err: unknown) => {
        if (this.failure === undefined) {
          this.failure = err;
          this.onFailure?.(err);
        }
        this.inFlight.delete(settled);
        this.rawInFlight.delete(settled);
      },
    );
    this.inFlight.add(settled);
    if (raw) this.rawInFlight.add(settled);
  }

  private keyOf(name: string): string {
    return `${this.packsKey}${name}${PACK_SUFFIX}`;
  }

  private async upload(slot: number, name: string, plain: string): Promise<void> {
    const packed = `${plain}.zst`;
    try {
      await this.compressing.run(async () => {
        if (this.failure !== undefined) throw this.failure;
        await zstdCompressFile(plain, packed);
      });
      fsSync.rmSync(plain, { force: true });
      await this.put(slot, name, () => fsSync.readFileSync(packed));
    } finally {
      fsSync.rmSync(plain, { force: true });
      fsSync.rmSync(packed, { force: true });
    }
  }

  private async uploadRaw(slot: number, name: string, bytes: Buffer, frame: Slab | undefined): Promise<void> {
    // Hashed in the hashing thread (in shared memory, without a copy), not on the event loop, which sends it.
    const [sha256] = await hashSpans(bytes, [[0, bytes.length]]);
    await this.put(slot, name, () => bytes, sha256);
    // Sent and answered, it is read no more. A failed put keeps it from reuse: its request may still hold it.
    frame?.release();
    this.rawPacks += 1;
  }

  private async put(slot: number, name: string, read: () => Buffer, sha256?: string): Promise<void> {
    await this.putting.run(async () => {
      if (this.failure !== undefined) throw this.failure;
      this.signal?.throwIfAborted();
      const stored = read();
      const ref = await this.store.putBytes(this.keyOf(name), stored, {}, this.signal, sha256);
      const sealed = this.sealed[slot];
      // The segments already name the pack by the uri it was given when sealed.
      if (ref.uri !== sealed.uri) throw new Error(`pack ${sealed.uri} was stored as ${ref.uri}`);
      sealed.sha256 = ref.sha256;
      sealed.bytes = ref.bytes;
      this.uploadedBytes += stored.length;
      this.uploadedPacks += 1;
      this.progress.bytes += stored.length;
    });
  }
}

/**
 * The largest raw frame of a pack held in a reused buffer: its header, MAX_PACK_BYTES, and a block header for
 * each 128 KiB (more, if its chunks end off those bounds; such a frame gets a buffer of its own).
 */
const RAW_FRAME_BYTES = 9 + MAX_PACK_BYTES + 3 * (2 + Math.ceil(MAX_PACK_BYTES / (128 * 1024)));

/** Copies `parts` one after the other into `target`, which they fill exactly; returns `target`. */
function copyInto(parts: readonly Buffer[], target: Buffer): Buffer {
  let at = 0;
  for (const part of parts) at += part.copy(target, at);
  if (at !== target.length) throw new Error(`copied ${at} bytes into a frame of ${target.length}`);
  return target;
}

/** Writes `parts` (`size` bytes in all) to a new file. */
function writeParts(file: string, parts: Buffer[], size: number): void {
  const fd = fsSync.openSync(file, 'w', 0o600);
  try {
    let written = 0;
    // writev takes at most IOV_MAX (1024) buffers, and may write less than asked: the rest is written again.
    for (let i = 0; i < parts.length; i += 1024) {
      const batch = parts.slice(i, i + 1024);
      const bytes = batch.reduce((sum, part) => sum + part.length, 0);
      let done = fsSync.writevSync(fd, batch);
      if (done < bytes) {
        const rest = Buffer.concat(batch).subarray(done);
        for (let offset = 0; offset < rest.length; offset += done) {
          done = fsSync.writeSync(fd, rest, offset);
          if (done === 0) throw Object.assign(new Error(`no space left to write ${file}`), { code: 'ENOSPC' });
        }
      }
      written += bytes;
    }
    if (written !== size) throw new Error(`${file}: wrote ${written} of ${size} bytes`);
  } finally {
    fsSync.closeSync(fd);
  }
}
