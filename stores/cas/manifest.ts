import { constants } from 'node:buffer';
import { promisify } from 'node:util';
import * as zlib from 'node:zlib';
import { z } from 'zod';
import { StasisError } from '../../common/errors';
import { Checkpoint } from '../../common/schemas';
// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore } from '../index';
import { CheckpointChecker, type ArchiveLimits, type CheckedEntry } from '../archive';
import { hasEscapes } from '../raw-names';
import { CHUNK_SIZES } from './fastcdc';
import { chunkHash } from './hasher';
import { zstdCompress, zstdDecompress } from './zstd';

// The manifest of a content-addressed checkpoint: every entry of the sandbox's
// checkpoint directories in walk order, the chunks its files are made of, and
// where each chunk lives (pack, offset, length in the pack's decompressed bytes).
// The checkpoint's own object is `checkpoints/<sandboxId>/<fence>-<key>.manifest.gz`
// (gzip JSON; `.manifest.zst`, zstd JSON, as earlier versions wrote it, still reads).
// `stasis-cas-1` holds everything in it, so each checkpoint re-sent
// every entry; `stasis-cas-2` (written now) splits the entries into segments
// (`segments/<sha-256>.seg`, raw deflate JSON) cut by path hash, stored once and
// shared by every checkpoint that has the same segment, and the object itself
// (the top) only names its segments and packs: an unchanged re-suspend writes the
// top alone. Either names every object it needs, so it restores on its own.
// `stasis-cas-3` is `stasis-cas-2` written for a tree holding a name or symlink target
// that is not UTF-8 (escaped in its string, stores/raw-names.ts), so that readers
// before it refuse it rather than restore the name as U+FFFD bytes (splitFormat).

/**
 * The ending of a content-addressed checkpoint's own object (its top object) as written now: gzip, in
 * this process (a zstd command per top object cost a spawn, ~30 ms, each suspend and each read).
 */
export const MANIFEST_SUFFIX = '.manifest.gz';
/** The ending earlier versions wrote (zstd through the command): still read, never written. */
export const ZSTD_MANIFEST_SUFFIX = '.manifest.zst';
/** Packs live under the sandbox's prefix, named by the sha-256 of their bytes. */
export const PACKS_DIR = 'packs/';
export const PACK_SUFFIX = '.pack';
/** Segments of `stasis-cas-2` manifests live under the sandbox's prefix, named by the sha-256 of their JSON. */
export const SEGMENTS_DIR = 'segments/';
export const SEGMENT_SUFFIX = '.seg';
/**
 * The longest decompressed manifest read: JSON.parse takes a string, and none is longer than this,
 * so decompression of a bomb stops here rather than holding gigabytes (or failing past Buffer's limit).
 */
export const MAX_MANIFEST_JSON_BYTES = constants.MAX_STRING_LENGTH;
/** A pack is sealed once its chunks reach this size. */
export const PACK_BYTES = 8 * 1024 * 1024;
/** No pack an upload seals is larger (it was below PACK_BYTES before its last chunk): a manifest declaring more is refused. */
export const MAX_PACK_BYTES = PACK_BYTES + CHUNK_SIZES.max;

const Sha256 = z.string().regex(/^[0-9a-f]{64}$/);
const Ns = z.string().regex(/^[0-9]{1,25}$/);
/** A file's time in nanoseconds: before 1970 it is negative (`touch -d 1969-12-31` is any sandbox's to make). */
const FileNs = z.string().regex(/^-?[0-9]{1,25}$/);

export const ManifestEntry = z.object({
  /** `workspace/a/b` */
  p: z.string(),
  /** directory, file, symlink, hardlink */
  k: z.enum(['d', 'f', 'l', 'h']),
  /** permission bits */
  m: z.number().int().nonnegative(),
  s: z.number().int().nonnegative(),
  /** mtime in nanoseconds, as a decimal string; written to the microsecond (storedMtime), as a restore sets it */
  mt: FileNs,
  /**
   * ctime in nanoseconds: earlier versions wrote it, read and ignored now. A ctime is a fact of the host
   * (a restore elsewhere gives every file a new one), so it lives only in the local baseline: in a
   * segment it made every segment new after a restore on another host.
   */
  ct: FileNs.optional(),
  /** a symlink's target, verbatim; a hardlink's first path */
  l: z.string().optional(),
  /** a file's chunk hashes, in order */
  c: z.array(Sha256).optional(),
});
export type ManifestEntry = z.infer<typeof ManifestEntry>;

/** hash → [pack index, offset, length] */
const ChunkLocations = z.record(
  Sha256,
  z.tuple([z.number().int().nonnegative(), z.number().int().nonnegative(), z.number().int().positive()]),
);
/** Each pack: where it is, the sha-256 and size of its stored bytes, and its decompressed size. */
const PackRefs = z.array(Checkpoint.extend({ size: z.number().int().nonnegative() }));
/** A segment of a `stasis-cas-2` manifest: [sha-256 of its JSON (its name), stored bytes, JSON bytes, entries]. */
export const SegmentRef = z.tuple([
  Sha256,
  z.number().int().positive(),
  z.number().int().positive(),
  z.number().int().nonnegative(),
]);
export type SegmentRef = z.infer<typeof SegmentRef>;

/** `stasis-cas-1` on the wire: one object with every entry, every chunk's location and the pack list. */
export const ManifestV1 = z.object({
  format: z.literal('stasis-cas-1'),
  /** When the walk began (ns since the epoch): a file modified since then is not trusted by its stat (racy-git rule). */
  takenAtNs: Ns,
  entries: z.array(ManifestEntry),
  chunks: ChunkLocations,
  packs: PackRefs,
});

/**
 * The format of a split manifest of `entries`: `stasis-cas-3` when a path or symlink target holds a
 * name that is not UTF-8 (escaped, stores/raw-names.ts), `stasis-cas-2` otherwise. The two are the
 * same on the wire but for this field: readers before `-3` would write an escaped name as U+FFFD
 * bytes (a silently wrong restore), and refuse a format they do not know instead. Trees of UTF-8
 * names keep `-2`, which every worker reads.
 */
export function splitFormat(entries: readonly ManifestEntry[]): 'stasis-cas-2' | 'stasis-cas-3' {
  for (const entry of entries) {
    if (hasEscapes(entry.p) || (entry.l !== undefined && hasEscapes(entry.l))) return 'stasis-cas-3';
  }
  return 'stasis-cas-2';
}

/** Whether `format` is a split one (top object and segments). */
export function isSplitFormat(format: string): format is 'stasis-cas-2' | 'stasis-cas-3' {
  return format === 'stasis-cas-2' || format === 'stasis-cas-3';
}

/**
 * `stasis-cas-2` on the wire, the top object: the segments holding the entries (in order) and every
 * pack their chunks are in. Segments are separate objects under `segments/`, named by the sha-256
 * of their JSON, so an unchanged segment is stored once and named by every checkpoint that has it.
 */
export const TopManifest = z.object({
  format: z.enum(['stasis-cas-2', 'stasis-cas-3']),
  takenAtNs: Ns,
  segments: z.array(SegmentRef),
  packs: PackRefs,
});
export type TopManifest = z.infer<typeof TopManifest>;

/** A manifest whole, as restore and the next checkpoint see it, whichever format it was read from. */
export const Manifest = ManifestV1.extend({
  format: z.enum(['stasis-cas-1', 'stasis-cas-2', 'stasis-cas-3']),
  /** `stasis-cas-2` and `-3`: the segments the entries are stored in (the next checkpoint uploads only those it lacks). */
  segments: z.array(SegmentRef).optional(),
});
export type Manifest = z.infer<typeof Manifest>;
export type PackRef = Manifest['packs'][number];

const SHA256 = /^[0-9a-f]{64}$/;
const FILE_NS = /^-?[0-9]{1,25}$/;
const KINDS = new Set(['d', 'f', 'l', 'h']);
const isCount = (x: unknown) => typeof x === 'number' && Number.isInteger(x) && x >= 0;

/**
 * What ManifestEntry's schema accepts (a property test holds the two together): zod took most of a
 * second for 20,000 entries, so the bulk of baselines and segments is checked by hand.
 */
export function isManifestEntry(value: unknown): value is ManifestEntry {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const e = value as Record<string, unknown>;
  return (
    typeof e.p === 'string' &&
    typeof e.k === 'string' &&
    KINDS.has(e.k) &&
    isCount(e.m) &&
    isCount(e.s) &&
    typeof e.mt === 'string' &&
    FILE_NS.test(e.mt) &&
    (e.ct === undefined || (typeof e.ct === 'string' && FILE_NS.test(e.ct))) &&
    (e.l === undefined || typeof e.l === 'string') &&
    (e.c === undefined || (Array.isArray(e.c) && e.c.every((h) => typeof h === 'string' && SHA256.test(h))))
  );
}

/** What the schema of a manifest's chunk locations accepts: [pack, offset, length > 0]. */
export function isChunkLocation(hash: string, value: unknown): boolean {
  return (
    SHA256.test(hash) &&
    Array.isArray(value) &&
    value.length === 3 &&
    isCount(value[0]) &&
    isCount(value[1]) &&
    isCount(value[2]) &&
    (value[2] as number) > 0
  );
}

const TAR_TYPES = { d: 'Directory', f: 'File', l: 'SymbolicLink', h: 'Link' } as const;

/** The entry as the checkpoint rules see it (the same checker as tar.gz checkpoints). */
export function admitEntry(checker: CheckpointChecker, entry: ManifestEntry): CheckedEntry {
  return checker.admit({
    path: entry.p,
    type: TAR_TYPES[entry.k],
    mode: entry.m,
    mtime: undefined,
    size: entry.s,
    linkpath: entry.l ?? '',
  });
}

/**
 * An mtime as entries hold it: to the microsecond, which is what a restore can set (utimes) and what a
 * restored file then reads back, so an entry is the same before and after a restore on any host.
 */
export function storedMtime(mtimeNs: bigint): string {
  return ((mtimeNs / 1000n) * 1000n).toString();
}

/**
 * `stasis-cas-1` bytes of a manifest, zstd as earlier versions wrote it under ZSTD_MANIFEST_SUFFIX
 * (tests craft old checkpoints with it).
 */
export async function encodeManifest(manifest: Manifest): Promise<Buffer> {
  const { segments: _, ...v1 } = manifest;
  return zstdCompress(Buffer.from(JSON.stringify({ ...v1, format: 'stasis-cas-1' })));
}

/**
 * The JSON bytes (top object and segments together) a restore reads of a manifest under `limits`: an
 * entry holds about 200, so this keeps a bomb out. A release checks its manifest against it too
 * (takeCheckpoint): a long path or link target of bytes that are not UTF-8 takes six in JSON (`\udcff`)
 * per byte, and a checkpoint over the budget would be stored, compute terminated, and every restore refused.
 */
export function manifestJsonBudget(limits: ArchiveLimits): number {
  return Math.min(limits.maxEntries * MANIFEST_JSON_BYTES_PER_ENTRY, MAX_MANIFEST_JSON_BYTES);
}

/** What manifestJsonBudget allows per entry of `maxEntries`. */
export const MANIFEST_JSON_BYTES_PER_ENTRY = 8192;

/**
 * The top object's bytes, stored under MANIFEST_SUFFIX: gzip, synchronously (a few KiB at 20,000
 * files take well under a millisecond; the zstd command took ~30 ms a call).
 */
export function encodeTop(top: TopManifest): Buffer {
  return zlib.gzipSync(Buffer.from(JSON.stringify(top)), { level: 6 });
}

/**
 * Reads the manifest whose top object's bytes are `data` (downloaded from `uri`, its hash checked):
 * `stasis-cas-1` as it is, `stasis-cas-2` with its segments fetched from `store` and each checked
 * against its name. Checks it whole (ManifestCheck, each segment's entries as it arrives) before anything is written.
 */
export async function readManifest(
  store: CheckpointStore,
  data: Buffer,
  uri: string,
  limits: ArchiveLimits,
  signal?: AbortSignal,
  /** Told the pack list as soon as it is read (restore starts fetching packs), before the rest is fetched and checked. */
  onPacks?: (packs: PackRef[]) => void,
): Promise<Manifest> {
  const budget = { left: manifestJsonBudget(limits) };
  const json = await decodeTopObject(data, uri, budget.left);
  budget.left -= json.length;
  const value = parseJson(json, uri);
  const format = (value as { format?: unknown } | undefined)?.format;
  if (typeof format !== 'string' || !isSplitFormat(format))
    return checkManifest(parseOr(ManifestV1, value, uri), uri, packsPrefixOf(uri), limits);
  const top = parseOr(TopManifest, value, uri);
  onPacks?.(top.packs);
  // Each segment's entries are checked as it arrives, the rest once all are here.
  const check = new ManifestCheck(uri, limits);
  return check.finish(await readSegments(store, top, uri, limits, budget, signal, check), packsPrefixOf(uri));
}

function parseJson(json: Buffer, uri: string): unknown {
  try {
    return JSON.parse(json.toString('utf8'));
  } catch (err) {
    throw invalid(uri, `is not a valid manifest: ${(err as Error).message.slice(0, 500)}`);
  }
}

function parseOr<T>(schema: z.ZodType<T>, value: unknown, uri: string): T {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw invalid(uri, `is not a valid manifest: ${parsed.error.message.slice(0, 500)}`);
  return parsed.data;
}

/** Segments fetched at once by a restore. */
const SEGMENTS_AHEAD = 32;

/**
 * The entries of a `stasis-cas-2` manifest, gathered from its segments in order. Each segment is
 * read (at most its declared size), inflated (at most its declared JSON size) and its JSON
 * hashed: bytes that do not hash to its name, or a segment missing from the store, is
 * CHECKPOINT_INVALID naming it, as for chunks. Chunk locations are translated from the segment's
 * own pack names to the top object's pack list, which must list each.
 */
async function readSegments(
  store: CheckpointStore,
  top: TopManifest,
  uri: string,
  limits: ArchiveLimits,
  budget: { left: number },
  signal: AbortSignal | undefined,
  check: ManifestCheck,
): Promise<Manifest> {
  // Refused before anything is fetched: segments are read at most their declared size, and inflated at most their declared JSON.
  const declared = top.segments.reduce((sum, [, , , entries]) => sum + entries, 0);
  if (declared > limits.maxEntries) {
    throw invalid(uri, `declares ${declared} entries, above the limit of ${limits.maxEntries} per checkpoint`);
  }
  const jsonBytes = top.segments.reduce((sum, [, , json]) => sum + json, 0);
  if (jsonBytes > budget.left) throw invalid(uri, `declares segments of ${jsonBytes} bytes, above ${budget.left}`);
  const packsPrefix = packsPrefixOf(uri);
  const packIndex = new Map(top.packs.map((pack, i) => [pack.uri, i]));
  const segmentsPrefix = segmentsPrefixOf(uri);
  const bodies: Promise<Buffer>[] = [];
  const fetchOne = async ([name, bytes, jsonLength]: SegmentRef): Promise<Buffer> => {
    const segmentUri = `${segmentsPrefix}${name}${SEGMENT_SUFFIX}`;
    let stored: Buffer;
    try {
      stored = await store.read(segmentUri, bytes, signal);
    } catch (err) {
      if (err instanceof StasisError && err.code === 'NOT_FOUND') {
        throw invalid(uri, `needs segment ${segmentUri}, which is missing from the store`);
      }
      if (err instanceof StasisError && err.code === 'CHECKPOINT_INVALID') {
        throw invalid(uri, `has a segment ${segmentUri} larger than the ${bytes} bytes it declares`);
      }
      throw err;
    }
    const json = await inflateBounded(stored, segmentUri, jsonLength, uri);
    const hash = chunkHash(json);
    if (hash !== name) throw invalid(uri, `has a corrupt segment ${segmentUri} (its bytes hash to ${hash})`);
    return json;
  };
  // A few ahead, in order: the first segment's errors come first, whatever finishes first.
  let next = 0;
  const startMore = () => {
    while (next < top.segments.length && next - done < SEGMENTS_AHEAD) {
      const body = fetchOne(top.segments[next]);
      body.catch(() => undefined); // awaited in its turn
      bodies.push(body);
      next += 1;
    }
  };
  let done = 0;
  const entries: ManifestEntry[] = [];
  const chunks: Manifest['chunks'] = {};
  try {
    startMore();
    for (; done < top.segments.length;) {
      const [name, , , count] = top.segments[done];
      const json = await bodies[done];
      done += 1;
      startMore();
      const segmentUri = `${segmentsPrefix}${name}${SEGMENT_SUFFIX}`;
      const bad = (why: string) => invalid(uri, `has a segment ${segmentUri} that ${why}`);
      let segment: Record<string, unknown> | null;
      try {
        segment = JSON.parse(json.toString('utf8')) as Record<string, unknown> | null;
      } catch (err) {
        throw bad(`is not JSON: ${(err as Error).message.slice(0, 200)}`);
      }
      if (typeof segment !== 'object' || segment === null || segment.format !== SEGMENT_FORMAT) {
        throw bad('is not a segment');
      }
      const { packs, chunks: located, entries: listed } = segment;
      if (!Array.isArray(packs) || !Array.isArray(listed) || typeof located !== 'object' || located === null) {
        throw bad('is not a segment');
      }
      if (listed.length !== count) throw bad(`holds ${listed.length} entries, not the ${count} declared`);
      const indexes = packs.map((pack: unknown) => {
        const index =
          typeof pack === 'string' && SHA256.test(pack)
            ? packIndex.get(`${packsPrefix}${pack}${PACK_SUFFIX}`)
            : undefined;
        if (index === undefined) throw bad(`names a pack ${JSON.stringify(pack)} the checkpoint does not list`);
        return index;
      });
      for (const hash in located) {
        if (!Object.hasOwn(located, hash)) continue;
        const location = (located as Record<string, unknown>)[hash];
        if (!isChunkLocation(hash, location)) throw bad(`locates chunk ${JSON.stringify(hash)} wrongly`);
        const [pack, offset, length] = location as [number, number, number];
        if (pack >= indexes.length) throw bad(`locates chunk ${hash} in a pack it does not name`);
        chunks[hash] ??= [indexes[pack], offset, length];
      }
      for (const entry of listed) {
        if (!isManifestEntry(entry)) throw bad(`has an invalid entry ${JSON.stringify(entry).slice(0, 200)}`);
        check.entry(entry, chunks);
        entries.push(entry);
      }
      signal?.throwIfAborted();
    }
  } finally {
    await Promise.allSettled(bodies);
  }
  return {
    format: top.format,
    takenAtNs: top.takenAtNs,
    entries,
    chunks,
    packs: top.packs,
    segments: top.segments,
  };
}

/**
 * Checks a manifest against every rule restore applies before a byte is written: entry paths and
 * types (CheckpointChecker), each file's chunks known and adding up to its size, each chunk inside
 * its pack, each pack under `packsPrefix` (the uri of the manifest's own `packs/` directory).
 * Normalises the entries in place (paths, modes) as the rules admitted them.
 */
export function checkManifest(parsed: Manifest, uri: string, packsPrefix: string, limits: ArchiveLimits): Manifest {
  const check = new ManifestCheck(uri, limits);
  for (const entry of parsed.entries) check.entry(entry, parsed.chunks);
  return check.finish(parsed, packsPrefix);
}

/**
 * checkManifest in steps: each entry as it is read (in order: a segment's entries are checked while the
 * next segments download, ~40 ms of a 20,000-file restore that waited for the last one), then `finish`
 * once the manifest is whole. A file whose chunks are not located yet (a later segment may locate them)
 * is summed at `finish`; no entry passes before `finish` has run.
 */
export class ManifestCheck {
  private readonly checker: CheckpointChecker;
  private readonly directories = new Set<string>();
  /** Files with a chunk not located when they were read: summed by finish. */
  private readonly unlocated: { entry: ManifestEntry; size: number }[] = [];

  constructor(
    private readonly uri: string,
    limits: ArchiveLimits,
  ) {
    this.checker = new CheckpointChecker(limits);
  }

  entry(entry: ManifestEntry, chunks: Manifest['chunks']): void {
    const { uri } = this;
    const checked = admitEntry(this.checker, entry);
    // Restore writes what the rules admitted: the normalised path, and never a setuid or setgid bit.
    const raw = entry.p;
    entry.p = checked.path;
    entry.m = checked.mode;
    if (entry.k === 'h') entry.l = checked.linkpath;
    if (entry.k === 'd') this.directories.add(entry.p);
    const parent = entry.p.slice(0, Math.max(0, entry.p.lastIndexOf('/')));
    if (parent !== '' && !this.directories.has(parent)) {
      throw invalid(uri, `lists ${JSON.stringify(raw)} but not its directory ${JSON.stringify(parent)} before it`);
    }
    if (entry.k !== 'f') {
      if (entry.c !== undefined) throw invalid(uri, `names chunks for ${JSON.stringify(raw)}, which is not a file`);
      return;
    }
    const total = locatedBytes(entry, chunks);
    if (total === undefined) this.unlocated.push({ entry, size: checked.size });
    else if (total !== checked.size) {
      throw invalid(uri, `has chunks of ${total} bytes for ${JSON.stringify(entry.p)} of ${checked.size} bytes`);
    }
  }

  /** The rules that need the whole manifest; returns it, checked. */
  finish(parsed: Manifest, packsPrefix: string): Manifest {
    const { uri } = this;
    for (const { entry, size } of this.unlocated) {
      const missing = (entry.c ?? []).find((hash) => !Object.hasOwn(parsed.chunks, hash));
      if (missing !== undefined) {
        throw invalid(uri, `names chunk ${missing} of ${JSON.stringify(entry.p)}, which it does not locate`);
      }
      const total = locatedBytes(entry, parsed.chunks) ?? 0;
      if (total !== size) {
        throw invalid(uri, `has chunks of ${total} bytes for ${JSON.stringify(entry.p)} of ${size} bytes`);
      }
    }
    this.checker.finish();
    // Keys in turn, not Object.entries: an array of [key, value] pairs per chunk was garbage at 20,000 chunks.
    for (const hash in parsed.chunks) {
      if (!Object.hasOwn(parsed.chunks, hash)) continue;
      const [pack, offset, length] = parsed.chunks[hash];
      const ref = parsed.packs[pack];
      if (!ref || offset + length > ref.size) throw invalid(uri, `locates chunk ${hash} outside its pack`);
    }
    for (const pack of parsed.packs) checkPackRef(pack, uri, packsPrefix);
    return parsed;
  }
}

/** The bytes of a file's chunks, or undefined if one of them is not located (yet). */
function locatedBytes(entry: ManifestEntry, chunks: Manifest['chunks']): number | undefined {
  let total = 0;
  for (const hash of entry.c ?? []) {
    const location = Object.hasOwn(chunks, hash) ? chunks[hash] : undefined;
    if (!location) return undefined;
    total += location[2];
  }
  return total;
}

/** Refuses a pack of the manifest at `uri` that is too large or outside its sandbox's packs (`packsPrefix`). */
export function checkPackRef(pack: PackRef, uri: string, packsPrefix: string): void {
  // Compressed, a pack is hardly larger (zstd's worst case is about 1/256 above its input): twice is generous.
  for (const [what, bytes, limit] of [
    ['bytes', pack.size, MAX_PACK_BYTES],
    ['stored bytes', pack.bytes, 2 * MAX_PACK_BYTES],
  ] as const) {
    if (bytes > limit) {
      throw invalid(uri, `declares ${bytes} ${what} for pack ${JSON.stringify(pack.uri)}, above ${limit}`);
    }
  }
  const name = pack.uri.slice(packsPrefix.length);
  if (!pack.uri.startsWith(packsPrefix) || !/^[0-9a-f]{64}\.pack$/.test(name)) {
    throw invalid(uri, `names a pack ${JSON.stringify(pack.uri)} outside its sandbox's packs`);
  }
}

/** The `format` of a segment object. */
const SEGMENT_FORMAT = 'stasis-cas-2-segment';
/**
 * Segment boundaries: after an entry whose path hashes to 0 modulo SEGMENT_SPREAD, once a segment
 * has SEGMENT_MIN_ENTRIES; forced at SEGMENT_MAX_ENTRIES or SEGMENT_MAX_JSON bytes. The boundaries
 * depend on paths alone, so a changed file changes only its segment, and a file added or removed
 * only its own (or splits or joins two): every other segment keeps its bytes and its name. About
 * 470 entries a segment: at 20,000 files 43 segments (~44 KB stored each) and a top object of ~3 KB.
 * Each segment is a put (~2.5 ms of CPU between the SDK and a local MinIO): at 256 (81 segments of
 * ~22 KB) a first snapshot of 20,000 files took 1.2x as long (per-rep median, load ~4.8), which a
 * one-file change's smaller segment did not make up; at 150 the first checkpoint's 140 segment
 * uploads cost more still.
 */
const SEGMENT_SPREAD = 512;
const SEGMENT_MIN_ENTRIES = 32;
const SEGMENT_MAX_ENTRIES = 2048;
const SEGMENT_MAX_JSON = 4 * 1024 * 1024;

/** A segment ready to store: its name (sha-256 of `json`) and its JSON; no JSON when the previous manifest's segment is it. */
export interface SegmentBody {
  ref: SegmentRef;
  json?: Buffer;
}

/** Where a chunk is: its pack, and its offset and length in the pack's decompressed bytes. */
export interface ChunkPlace {
  pack: PackRef;
  offset: number;
  length: number;
}

/**
 * Splits a whole manifest into `stasis-cas-2`: its segments (entries with the locations of their
 * chunks, packs named by the name in their key) and the top object naming them (see Segmenter).
 * `ref[1]` (stored bytes) is 0 until the segment is compressed and stored (upload.ts).
 */
export function splitManifest(
  manifest: Manifest,
  previous?: Manifest,
): { segments: SegmentBody[]; takenAtNs: string; packs: PackRef[] } {
  const segmenter = new Segmenter((hash) => {
    const [pack, offset, length] = manifest.chunks[hash];
    return { pack: manifest.packs[pack], offset, length };
  }, previous);
  const segments: SegmentBody[] = [];
  for (const entry of manifest.entries) {
    const segment = segmenter.push(entry);
    if (segment) segments.push(segment);
  }
  const last = segmenter.end();
  if (last) segments.push(last);
  return { segments, takenAtNs: manifest.takenAtNs, packs: manifest.packs };
}

/**
 * Cuts a manifest's entries, given one at a time in order, into `stasis-cas-2` segments: a segment is
 * made as soon as its last entry is given, so a checkpoint stores its segments while its walk goes
 * on. Each entry's chunks must be located (`locate`) when it is given. The segments' bytes depend
 * only on their entries and where their chunks are, never on the rest of the manifest.
 *
 * `previous`, a manifest whose entries are exactly those of its segments (one this engine split and
 * stored, see Baseline.split), spares the JSON and the hash of every segment whose entries are the
 * same as one of its segments' (same first path, count and fields): its chunks are then located where
 * `previous` located them (the upload takes a chunk the baseline holds from there), so its bytes are
 * that segment's. An unchanged re-suspend of 20,000 files spent ~180 ms (load ~9) serialising and
 * hashing segments it then did not upload.
 */
export class Segmenter {
  private readonly earlier: Map<string, { ref: SegmentRef; start: number }>;
  private entries: ManifestEntry[] = [];
  private jsonBytes = 0;
  /** Each pack's name (in its key), by uri. */
  private readonly names = new Map<string, string>();

  constructor(
    private readonly locate: (hash: string) => ChunkPlace | undefined,
    private readonly previous?: Manifest,
  ) {
    this.earlier = segmentsByFirstPath(previous);
  }

  /** Takes the next entry; returns the segment it ends, if it ends one. */
  push(entry: ManifestEntry): SegmentBody | undefined {
    this.entries.push(entry);
    this.jsonBytes += 120 + entry.p.length + (entry.l?.length ?? 0) + 67 * (entry.c?.length ?? 0) * 2;
    const count = this.entries.length;
    if (
      (count >= SEGMENT_MIN_ENTRIES && pathHash(entry.p) % SEGMENT_SPREAD === 0) ||
      count >= SEGMENT_MAX_ENTRIES ||
      this.jsonBytes >= SEGMENT_MAX_JSON
    ) {
      return this.cut();
    }
    return undefined;
  }

  /** The last segment, once every entry was given (none if the last entry ended one). */
  end(): SegmentBody | undefined {
    return this.entries.length > 0 ? this.cut() : undefined;
  }

  private cut(): SegmentBody {
    const list = this.entries;
    this.entries = [];
    this.jsonBytes = 0;
    const same = this.earlier.get(list[0].p);
    if (same && same.ref[3] === list.length && sameEntries(list, 0, this.previous!.entries, same.start, list.length)) {
      return { ref: same.ref };
    }
    const entries = list.map(canonicalEntry);
    const packs: string[] = [];
    const packIndex = new Map<string, number>();
    const chunks: Record<string, [number, number, number]> = {};
    for (const entry of entries) {
      for (const hash of entry.c ?? []) {
        if (Object.hasOwn(chunks, hash)) continue;
        const where = this.locate(hash);
        if (!where) throw new Error(`chunk ${hash} of ${entry.p} is in no pack`);
        let index = packIndex.get(where.pack.uri);
        if (index === undefined) {
          index = packs.push(this.nameOf(where.pack.uri)) - 1;
          packIndex.set(where.pack.uri, index);
        }
        chunks[hash] = [index, where.offset, where.length];
      }
    }
    const json = Buffer.from(JSON.stringify({ format: SEGMENT_FORMAT, packs, chunks, entries }));
    return { ref: [chunkHash(json), 0, json.length, entries.length], json };
  }

  private nameOf(uri: string): string {
    let name = this.names.get(uri);
    if (name === undefined) {
      name = uri.slice(uri.lastIndexOf('/') + 1, -PACK_SUFFIX.length);
      this.names.set(uri, name);
    }
    return name;
  }
}

/** The segments of `manifest` by the path of their first entry, with where that entry is. */
function segmentsByFirstPath(manifest: Manifest | undefined): Map<string, { ref: SegmentRef; start: number }> {
  const out = new Map<string, { ref: SegmentRef; start: number }>();
  if (!manifest?.segments) return out;
  let start = 0;
  for (const ref of manifest.segments) {
    if (start + ref[3] > manifest.entries.length) return new Map(); // not the manifest its segments hold
    if (ref[3] > 0) out.set(manifest.entries[start].p, { ref, start });
    start += ref[3];
  }
  return start === manifest.entries.length ? out : new Map();
}

/** Whether `count` entries from `a[i]` and from `b[j]` are the same in every field a segment holds. */
function sameEntries(a: ManifestEntry[], i: number, b: ManifestEntry[], j: number, count: number): boolean {
  for (let n = 0; n < count; n += 1) {
    const x = a[i + n];
    const y = b[j + n];
    // The very entry (a file the baseline vouched for keeps the baseline's own).
    if (x === y && x.ct === undefined) continue;
    if (
      x.p !== y.p ||
      x.k !== y.k ||
      x.m !== y.m ||
      x.s !== y.s ||
      x.mt !== y.mt ||
      x.l !== y.l ||
      x.ct !== undefined ||
      y.ct !== undefined ||
      (x.c === undefined) !== (y.c === undefined)
    ) {
      return false;
    }
    if (x.c && y.c && (x.c.length !== y.c.length || x.c.some((hash, k) => hash !== y.c![k]))) return false;
  }
  return true;
}

/** The entry with its keys in one order, whatever order it was built in: its segment's bytes depend on its content only. */
function canonicalEntry(entry: ManifestEntry): ManifestEntry {
  return {
    p: entry.p,
    k: entry.k,
    m: entry.m,
    s: entry.s,
    mt: entry.mt,
    ...(entry.l !== undefined ? { l: entry.l } : {}),
    ...(entry.c !== undefined ? { c: entry.c } : {}),
  };
}

/** FNV-1a of a path's UTF-16 units: cheap, and the same on every host. */
function pathHash(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i += 1) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash;
}

/**
 * A segment's stored bytes: raw deflate, in this process (a zstd command per segment cost a spawn
 * each), in the thread pool: a checkpoint compresses its segments while its walk goes on, which
 * keeps the event loop, the walk's one thread, busy (~100 ms of it at 20,000 files). Level 1, as
 * packs are: a segment is mostly chunk hashes, which no level compresses (a 44 KB segment of 250
 * files: 12.5 KB at level 1, 12.3 KB at 6, for a quarter to a third of the CPU; readers inflate any level).
 */
export function compressSegment(json: Buffer): Promise<Buffer> {
  return deflateRaw(json, { level: 1 });
}

const deflateRaw = promisify(zlib.deflateRaw);

async function inflateBounded(stored: Buffer, segmentUri: string, maxBytes: number, uri: string): Promise<Buffer> {
  try {
    return await inflateRaw(stored, { maxOutputLength: Math.max(1, maxBytes) });
  } catch (err) {
    if ((err as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE') {
      throw invalid(uri, `has a segment ${segmentUri} that expands past ${maxBytes} bytes`);
    }
    throw invalid(uri, `has a segment ${segmentUri} that cannot be decompressed: ${(err as Error).message}`);
  }
}

/** The uri of the `segments/` directory beside a manifest. */
export function segmentsPrefixOf(manifestUri: string): string {
  return `${manifestUri.slice(0, manifestUri.lastIndexOf('/') + 1)}${SEGMENTS_DIR}`;
}

/** The uri of the `packs/` directory beside a manifest. */
export function packsPrefixOf(manifestUri: string): string {
  return `${manifestUri.slice(0, manifestUri.lastIndexOf('/') + 1)}${PACKS_DIR}`;
}

const inflateRaw = promisify(zlib.inflateRaw);

const gunzip = promisify(zlib.gunzip);

/** Whether `uri` (or a key) names a content-addressed checkpoint's own object, as written now or earlier. */
export function isManifestUri(uri: string): boolean {
  return uri.endsWith(MANIFEST_SUFFIX) || uri.endsWith(ZSTD_MANIFEST_SUFFIX);
}

/**
 * The JSON of a checkpoint's own object, decoded as its ending says (gzip, or zstd as earlier versions
 * wrote it), at most `maxBytes` of it: the manifest's size is not recorded anywhere else, so a bomb
 * stops there. Anything that does not decode is CHECKPOINT_INVALID naming `uri`.
 */
export async function decodeTopObject(data: Buffer, uri: string, maxBytes: number): Promise<Buffer> {
  if (uri.endsWith(ZSTD_MANIFEST_SUFFIX)) {
    try {
      return await zstdDecompress(data, -1, `manifest ${uri}`, maxBytes);
    } catch (err) {
      if (err instanceof StasisError) throw err;
      throw invalid(uri, `cannot be decompressed: ${(err as Error).message}`);
    }
  }
  if (!uri.endsWith(MANIFEST_SUFFIX)) throw invalid(uri, 'is not named as a manifest');
  try {
    // In the thread pool: a hostile object may expand to hundreds of MiB before the bound stops it.
    return await gunzip(data, { maxOutputLength: Math.max(1, maxBytes) });
  } catch (err) {
    if ((err as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE') {
      throw invalid(uri, `is not a valid manifest: its output exceeds ${maxBytes} bytes`);
    }
    throw invalid(uri, `cannot be decompressed: ${(err as Error).message}`);
  }
}

export function invalid(uri: string, why: string): StasisError {
  return new StasisError('CHECKPOINT_INVALID', `checkpoint ${uri} ${why}`);
}
