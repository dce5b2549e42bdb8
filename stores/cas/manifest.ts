import { constants } from 'node:buffer';
import { z } from 'zod';
import { StasisError } from '../../common/errors';
import { Checkpoint } from '../../common/schemas';
import { CheckpointChecker, type ArchiveLimits, type CheckedEntry } from '../archive';
import { CHUNK_SIZES } from './fastcdc';
import { zstdCompress, zstdDecompress } from './zstd';

// The manifest of a content-addressed checkpoint: every entry of the sandbox's
// checkpoint directories in walk order, the chunks its files are made of, and
// where each chunk lives (pack, offset, length in the pack's decompressed bytes).
// Stored as zstd-compressed JSON beside its packs: `checkpoints/<sandboxId>/<fence>-<key>.manifest.zst`.
// A manifest names every pack it needs, so it restores on its own.

/** The ending that tells a content-addressed checkpoint from a tar.gz one. */
export const MANIFEST_SUFFIX = '.manifest.zst';
/** Packs live under the sandbox's prefix, named by the sha-256 of their bytes. */
export const PACKS_DIR = 'packs/';
export const PACK_SUFFIX = '.pack';
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

export const ManifestEntry = z.object({
  /** `workspace/a/b` */
  p: z.string(),
  /** directory, file, symlink, hardlink */
  k: z.enum(['d', 'f', 'l', 'h']),
  /** permission bits */
  m: z.number().int().nonnegative(),
  s: z.number().int().nonnegative(),
  /** mtime and ctime in nanoseconds, as decimal strings */
  mt: Ns,
  ct: Ns,
  /** a symlink's target, verbatim; a hardlink's first path */
  l: z.string().optional(),
  /** a file's chunk hashes, in order */
  c: z.array(Sha256).optional(),
});
export type ManifestEntry = z.infer<typeof ManifestEntry>;

export const Manifest = z.object({
  format: z.literal('stasis-cas-1'),
  /** When the walk began (ns since the epoch): a file modified since then is not trusted by its stat (racy-git rule). */
  takenAtNs: Ns,
  entries: z.array(ManifestEntry),
  /** hash → [pack index, offset, length] */
  chunks: z.record(
    Sha256,
    z.tuple([z.number().int().nonnegative(), z.number().int().nonnegative(), z.number().int().positive()]),
  ),
  /** Each pack: where it is, the sha-256 and size of its stored bytes, and its decompressed size. */
  packs: z.array(Checkpoint.extend({ size: z.number().int().nonnegative() })),
});
export type Manifest = z.infer<typeof Manifest>;
export type PackRef = Manifest['packs'][number];

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

export async function encodeManifest(manifest: Manifest): Promise<Buffer> {
  return zstdCompress(Buffer.from(JSON.stringify(manifest)));
}

/**
 * Decodes and checks a manifest against every rule restore applies before a
 * byte is written: entry paths and types (CheckpointChecker), each file's
 * chunks known and adding up to its size, each chunk inside its pack, each pack
 * under `packsPrefix` (the uri of the manifest's own `packs/` directory).
 */
export async function decodeManifest(
  data: Buffer,
  uri: string,
  packsPrefix: string,
  limits: ArchiveLimits,
): Promise<Manifest> {
  // A manifest holds about 200 bytes per entry; the limit keeps a bomb out.
  const json = await zstdDecompressBounded(data, uri, Math.min(limits.maxEntries * 8192, MAX_MANIFEST_JSON_BYTES));
  let parsed: Manifest;
  try {
    parsed = Manifest.parse(JSON.parse(json.toString('utf8')));
  } catch (err) {
    throw invalid(uri, `is not a valid manifest: ${(err as Error).message.slice(0, 500)}`);
  }
  const checker = new CheckpointChecker(limits);
  const directories = new Set<string>();
  for (const entry of parsed.entries) {
    const checked = admitEntry(checker, entry);
    // Restore writes what the rules admitted: the normalised path, and never a setuid or setgid bit.
    const raw = entry.p;
    entry.p = checked.path;
    entry.m = checked.mode;
    if (entry.k === 'h') entry.l = checked.linkpath;
    if (entry.k === 'd') directories.add(entry.p);
    const parent = entry.p.slice(0, Math.max(0, entry.p.lastIndexOf('/')));
    if (parent !== '' && !directories.has(parent)) {
      throw invalid(uri, `lists ${JSON.stringify(raw)} but not its directory ${JSON.stringify(parent)} before it`);
    }
    if (entry.k !== 'f') {
      if (entry.c !== undefined) throw invalid(uri, `names chunks for ${JSON.stringify(raw)}, which is not a file`);
      continue;
    }
    let total = 0;
    for (const hash of entry.c ?? []) {
      const location = parsed.chunks[hash];
      if (!location) throw invalid(uri, `names chunk ${hash} of ${JSON.stringify(entry.p)}, which it does not locate`);
      total += location[2];
    }
    if (total !== checked.size) {
      throw invalid(uri, `has chunks of ${total} bytes for ${JSON.stringify(entry.p)} of ${checked.size} bytes`);
    }
  }
  checker.finish();
  for (const [hash, [pack, offset, length]] of Object.entries(parsed.chunks)) {
    const ref = parsed.packs[pack];
    if (!ref || offset + length > ref.size) throw invalid(uri, `locates chunk ${hash} outside its pack`);
  }
  for (const pack of parsed.packs) {
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
  return parsed;
}

/** The uri of the `packs/` directory beside a manifest. */
export function packsPrefixOf(manifestUri: string): string {
  return `${manifestUri.slice(0, manifestUri.lastIndexOf('/') + 1)}${PACKS_DIR}`;
}

export function isManifestUri(uri: string): boolean {
  return uri.endsWith(MANIFEST_SUFFIX);
}

async function zstdDecompressBounded(data: Buffer, uri: string, maxBytes: number): Promise<Buffer> {
  // The manifest's size is not recorded anywhere else: bounded, not exact.
  try {
    return await zstdDecompress(data, -1, `manifest ${uri}`, maxBytes);
  } catch (err) {
    if (err instanceof StasisError) throw err;
    throw invalid(uri, `cannot be decompressed: ${(err as Error).message}`);
  }
}

export function invalid(uri: string, why: string): StasisError {
  return new StasisError('CHECKPOINT_INVALID', `checkpoint ${uri} ${why}`);
}
