import type { BigIntStats } from 'node:fs';
import { Readable } from 'node:stream';
import type { Checkpoint } from '../../common/schemas';
// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore } from '../index';
import { CheckpointChecker, type ArchiveLimits } from '../archive';
import { readExactly, walkSandbox, type WalkEntry } from '../walk';
import { RACY_MARGIN_NS, nowNs, type Baseline } from './baseline';
import { chunkHash, cutAndHash, hashRanges } from './hasher';
import {
  admitEntry,
  encodeManifest,
  MANIFEST_SUFFIX,
  PACK_BYTES,
  PACKS_DIR,
  PACK_SUFFIX,
  packsPrefixOf,
  type Manifest,
  type ManifestEntry,
  type PackRef,
} from './manifest';
import { zstdCompress } from './zstd';

// Taking a content-addressed checkpoint: walk, find what changed since the
// baseline, cut and hash only that, upload only chunks the baseline's checkpoint
// does not already hold (in packs of a few MiB), then the manifest. The manifest
// goes last: until it is in the store nothing names the new packs, and a killed
// attempt leaves only packs that garbage collection removes.

/** Files smaller than this are one chunk; larger ones are cut by FastCDC. */
export const WHOLE_FILE_BYTES = 1024 * 1024;
/** Packs compressed and uploading at once. */
const UPLOADS_IN_FLIGHT = 2;
/** Bytes of a large file read (and cut) at once. */
const READ_BYTES = 8 * 1024 * 1024;

export interface TakeStats {
  files: number;
  /** Files read and hashed (the rest kept their chunks from the baseline). */
  filesHashed: number;
  /** Compressed bytes of the packs uploaded. */
  packBytes: number;
  packs: number;
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
  signal?: AbortSignal;
}): Promise<{ checkpoint: Checkpoint; baseline: Baseline; stats: TakeStats }> {
  const { signal } = input;
  const baseline = await usableBaseline(input.store, input.baseline, input.prefix);
  const takenAtNs = nowNs();
  const checker = new CheckpointChecker(input.limits);
  const packer = new Packer(input.store, `${input.prefix}${PACKS_DIR}`, input.name, input.progress, signal);
  const known = knownChunks(baseline);
  const entries: ManifestEntry[] = [];
  const local: Baseline['local'] = {};
  const stats: TakeStats = { files: 0, filesHashed: 0, packBytes: 0, packs: 0 };
  try {
    for await (const walked of walkSandbox(input.rootDir, input.names)) {
      signal?.throwIfAborted();
      const entry = describe(walked);
      // Restore's own rules: a release never terminates compute for a checkpoint no restore would take.
      entry.m = admitEntry(checker, entry).mode;
      if (walked.kind === 'file' && walked.file) {
        stats.files += 1;
        const kept = unchangedChunks(baseline, entry, walked.stat);
        if (kept) entry.c = kept;
        else {
          stats.filesHashed += 1;
          entry.c = await chunkFile(walked, entry.s, (hash, bytes) => {
            if (!known.has(hash)) return packer.add(hash, bytes);
          });
        }
        local[entry.p] = [walked.stat.ino.toString(), walked.stat.ctimeNs.toString()];
      }
      entries.push(entry);
    }
    checker.finish();
    await packer.finish();
  } catch (err) {
    await packer.abandon();
    throw err;
  }
  const manifest = assemble(takenAtNs.toString(), entries, known, packer);
  stats.packBytes = packer.uploadedBytes;
  stats.packs = packer.uploadedPacks;
  const body = await encodeManifest(manifest);
  const checkpoint = await input.store.put(
    `${input.prefix}${input.name}${MANIFEST_SUFFIX}`,
    Readable.from([body]),
    input.labels,
    signal,
  );
  return { checkpoint, baseline: { uri: checkpoint.uri, takenAtNs: takenAtNs.toString(), manifest, local }, stats };
}

function describe(walked: WalkEntry): ManifestEntry {
  const { stat } = walked;
  const kind = ({ directory: 'd', file: 'f', symlink: 'l', hardlink: 'h' } as const)[walked.kind];
  return {
    p: walked.path,
    k: kind,
    m: Number(stat.mode & 0o7777n),
    s: walked.kind === 'file' ? Number(stat.size) : 0,
    mt: stat.mtimeNs.toString(),
    ct: stat.ctimeNs.toString(),
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

/** The chunks the baseline's checkpoint holds: reused without upload. */
function knownChunks(baseline: Baseline | undefined): Map<string, { pack: PackRef; offset: number; length: number }> {
  const known = new Map<string, { pack: PackRef; offset: number; length: number }>();
  if (!baseline) return known;
  const { chunks, packs } = baseline.manifest;
  for (const [hash, [pack, offset, length]] of Object.entries(chunks))
    known.set(hash, { pack: packs[pack], offset, length });
  return known;
}

/** The baseline's chunks of this file if it certainly did not change since; undefined if it must be read. */
function unchangedChunks(
  baseline: Baseline | undefined,
  entry: ManifestEntry,
  stat: BigIntStats,
): string[] | undefined {
  if (!baseline) return undefined;
  const previous = baselineEntry(baseline, entry.p);
  const here = baseline.local[entry.p];
  if (!previous || previous.k !== 'f' || !here || !previous.c) return undefined;
  const same =
    previous.s === entry.s &&
    previous.m === entry.m &&
    previous.mt === entry.mt &&
    here[0] === stat.ino.toString() &&
    here[1] === entry.ct;
  // Changed in the same clock tick as the baseline's stat: its stat cannot tell (git's racy rule).
  const racy = BigInt(entry.ct) + RACY_MARGIN_NS >= BigInt(baseline.takenAtNs);
  return same && !racy ? previous.c : undefined;
}

const entryIndexes = new WeakMap<Baseline, Map<string, ManifestEntry>>();
function baselineEntry(baseline: Baseline, entryPath: string): ManifestEntry | undefined {
  let index = entryIndexes.get(baseline);
  if (!index) {
    index = new Map(baseline.manifest.entries.map((entry) => [entry.p, entry]));
    entryIndexes.set(baseline, index);
  }
  return index.get(entryPath);
}

/** Reads a file once, cuts and hashes it, hands each chunk to `onChunk`; returns its chunk hashes. */
async function chunkFile(
  walked: WalkEntry,
  size: number,
  onChunk: (hash: string, bytes: Buffer) => Promise<void> | undefined,
): Promise<string[]> {
  const file = walked.file;
  if (!file || size === 0) return [];
  const hashes: string[] = [];
  if (size < WHOLE_FILE_BYTES) {
    const parts: Buffer[] = [];
    for await (const part of readExactly(file, size, walked.path, size)) parts.push(part);
    const bytes = parts.length === 1 ? parts[0] : Buffer.concat(parts);
    const [hash] = (await hashRanges(bytes, [bytes.length])).hashes;
    await onChunk(hash, bytes);
    return [hash];
  }
  let carry: Buffer = Buffer.alloc(0);
  let read = 0;
  for await (const part of readExactly(file, size, walked.path, READ_BYTES)) {
    read += part.length;
    const data = carry.length > 0 ? Buffer.concat([carry, part]) : part;
    const { ends, hashes: cut } = await cutAndHash(data, read === size);
    let start = 0;
    for (let i = 0; i < ends.length; i += 1) {
      await onChunk(cut[i], data.subarray(start, ends[i]));
      hashes.push(cut[i]);
      start = ends[i];
    }
    carry = data.subarray(start);
  }
  return hashes;
}

/** The manifest: every chunk its files name, located in the baseline's packs or the new ones. */
function assemble(
  takenAtNs: string,
  entries: ManifestEntry[],
  known: Map<string, { pack: PackRef; offset: number; length: number }>,
  packer: Packer,
): Manifest {
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
  return { format: 'stasis-cas-1', takenAtNs, entries, chunks, packs };
}

/** Groups new chunks into packs, compresses (zstd) and uploads them, a bounded number at once. */
class Packer {
  private parts: Buffer[] = [];
  private partHashes: string[] = [];
  private size = 0;
  private readonly pendingChunks = new Map<string, { offset: number; length: number; slot: number }>();
  private readonly sealed: (PackRef | undefined)[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private failure: unknown;
  uploadedBytes = 0;
  uploadedPacks = 0;

  constructor(
    private readonly store: CheckpointStore,
    private readonly packsKey: string,
    private readonly attempt: string,
    private readonly progress: { bytes: number },
    private readonly signal: AbortSignal | undefined,
  ) {}

  async add(hash: string, bytes: Buffer): Promise<void> {
    if (this.pendingChunks.has(hash)) return;
    this.pendingChunks.set(hash, { offset: this.size, length: bytes.length, slot: this.sealed.length });
    this.parts.push(bytes);
    this.partHashes.push(hash);
    this.size += bytes.length;
    if (this.size >= PACK_BYTES) await this.seal();
  }

  located(hash: string): { pack: PackRef; offset: number; length: number } | undefined {
    const where = this.pendingChunks.get(hash);
    const pack = where && this.sealed[where.slot];
    return where && pack ? { pack, offset: where.offset, length: where.length } : undefined;
  }

  async finish(): Promise<void> {
    if (this.size > 0) await this.seal();
    await Promise.all(this.inFlight);
    if (this.failure !== undefined) throw this.failure;
  }

  /** Waits for the uploads under way, so nothing is still writing once the attempt has failed. */
  async abandon(): Promise<void> {
    await Promise.allSettled(this.inFlight);
  }

  private async seal(): Promise<void> {
    const slot = this.sealed.length;
    this.sealed.push(undefined);
    const data = Buffer.concat(this.parts, this.size);
    // Named by its release request and the chunks it holds: a retry of the request that packs the same
    // chunks rewrites its own object, and never one another checkpoint names (a failed put removes its key).
    const name = chunkHash(Buffer.from(`${this.attempt}\n${this.partHashes.join('')}`));
    this.parts = [];
    this.partHashes = [];
    this.size = 0;
    while (this.inFlight.size >= UPLOADS_IN_FLIGHT) await Promise.race(this.inFlight);
    if (this.failure !== undefined) throw this.failure;
    const upload = this.upload(slot, name, data).then(
      () => {
        this.inFlight.delete(upload);
      },
      (err: unknown) => {
        this.failure ??= err;
        this.inFlight.delete(upload);
      },
    );
    this.inFlight.add(upload);
  }

  private async upload(slot: number, name: string, data: Buffer): Promise<void> {
    const compressed = await zstdCompress(data);
    const stored = await this.store.put(
      `${this.packsKey}${name}${PACK_SUFFIX}`,
      Readable.from([compressed]),
      {},
      this.signal,
    );
    this.sealed[slot] = { ...stored, size: data.length };
    this.uploadedBytes += compressed.length;
    this.uploadedPacks += 1;
    this.progress.bytes += compressed.length;
  }
}
