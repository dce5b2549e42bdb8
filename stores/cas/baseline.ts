import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import { z } from 'zod';
import { hasErrorCode } from '../atomic-file';
import { isChunkLocation, isManifestEntry, Manifest } from './manifest';

// What the last checkpoint of a sandbox looked like on this host: its manifest and,
// per file, the inode and ctime the file had when the manifest was taken (an
// upload) or written (a restore). Kept beside the sandbox's state, never in its
// checkpoint directories. A file whose size, mode, mtime, ctime and inode all match
// (and that was not modified in the last moments before, see isUnchanged) keeps
// its chunks without being read. Inodes and ctimes are this host's: a restore on
// another host writes its own baseline, so the next suspend there is incremental too.

export const Baseline = z.object({
  /** The manifest's uri: the baseline is used only while that checkpoint exists (its packs are then kept). */
  uri: z.string(),
  /** When the stats below were taken (ns since the epoch). */
  takenAtNs: z.string().regex(/^[0-9]+$/),
  manifest: Manifest,
  /** path → [inode, ctime ns] on this host */
  local: z.record(z.string(), z.tuple([z.string(), z.string()])),
  /**
   * The manifest's entries are exactly those its segments hold: it was split and stored by this engine
   * (takeCheckpoint), so the next checkpoint reuses a segment whose entries it has without serialising
   * it (splitManifest). A restore's baseline is not: restore normalises what it read.
   */
  split: z.boolean().optional(),
});
export type Baseline = z.infer<typeof Baseline>;

/**
 * Coarse filesystem clocks lag the wall clock by up to a tick: a file changed
 * this close to the moment its stat was taken is hashed again (git's racy rule).
 */
export const RACY_MARGIN_NS = 50_000_000n;

/**
 * How long a timestamp with no fraction of a second may stand for: a filesystem that keeps whole
 * seconds (ext4 with 128-byte inodes, some network filesystems; FAT keeps two) gives a change later
 * in the same second the same ctime. A ctime of a filesystem that keeps nanoseconds falls on a whole
 * second once in a billion: such a file is only read again.
 */
const COARSE_TIMESTAMP_NS = 2_000_000_000n;

/**
 * Until when a file whose ctime is `ctimeNs` may still change without its ctime telling (git's racy
 * rule): a baseline taken at or before it cannot vouch for the file by its stat.
 */
export function racyUntilNs(ctimeNs: bigint): bigint {
  return ctimeNs + RACY_MARGIN_NS + (ctimeNs % 1_000_000_000n === 0n ? COARSE_TIMESTAMP_NS : 0n);
}

/** The wall clock in ns. */
export function nowNs(): bigint {
  return BigInt(Date.now()) * 1_000_000n;
}

/**
 * The baseline's shape with its bulk (entries and chunks, tens of thousands at a time) left to
 * isBaselineEntry and isChunkLocation: zod took most of a second for 20,000 files, each suspend.
 */
const BaselineOutline = Baseline.extend({
  manifest: Manifest.extend({ entries: z.array(z.unknown()), chunks: z.record(z.string(), z.unknown()) }),
});

/** What ManifestEntry's schema accepts (a property test holds the two together). */
export const isBaselineEntry = isManifestEntry;
export { isChunkLocation };

/**
 * The baselines this process last read or wrote, by file, while the file is the very one (inode,
 * size, mtime and ctime as when cached): a suspend after a resume or an earlier suspend in the same
 * worker skips reading and checking it, which took 0.45 to 1.2 s for 20,000 files in a profile of
 * an unchanged re-suspend (load ~10), a third of it. Bounded by entries, the oldest dropped first.
 * Callers never modify a baseline they were given.
 */
const cached = new Map<string, { identity: string; baseline: Baseline }>();
const CACHED_ENTRIES = 60_000;

async function identityOf(file: string): Promise<string | undefined> {
  try {
    const stat = await fs.stat(file, { bigint: true });
    return `${stat.dev}:${stat.ino}:${stat.size}:${stat.mtimeNs}:${stat.ctimeNs}`;
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
}

function remember(file: string, identity: string, baseline: Baseline): void {
  cached.delete(file);
  cached.set(file, { identity, baseline });
  let entries = 0;
  for (const { baseline: kept } of cached.values()) entries += kept.manifest.entries.length;
  for (const [oldest, { baseline: dropped }] of cached) {
    if (entries <= CACHED_ENTRIES || oldest === file) break;
    cached.delete(oldest);
    entries -= dropped.manifest.entries.length;
  }
}

export async function readBaseline(file: string): Promise<Baseline | undefined> {
  const identity = await identityOf(file);
  const hit = cached.get(file);
  if (identity === undefined || hit?.identity !== identity) cached.delete(file);
  if (identity === undefined) return undefined;
  if (hit?.identity === identity) return hit.baseline;
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
  // Unreadable (an older format, a torn write): only an optimisation is lost.
  let baseline: Baseline | undefined;
  try {
    baseline = parseBaseline(JSON.parse(text));
  } catch {
    return undefined;
  }
  // Cached only if the file did not change while it was read.
  if (baseline && (await identityOf(file)) === identity) remember(file, identity, baseline);
  return baseline;
}

/** The baseline `value` holds, or undefined when it is not one. */
export function parseBaseline(value: unknown): Baseline | undefined {
  const parsed = BaselineOutline.safeParse(value);
  if (!parsed.success) return undefined;
  const { entries, chunks } = parsed.data.manifest;
  if (!entries.every(isBaselineEntry)) return undefined;
  for (const [hash, location] of Object.entries(chunks)) if (!isChunkLocation(hash, location)) return undefined;
  return parsed.data as Baseline;
}

/**
 * Written whole under a new name, then renamed into place: a reader sees the old baseline or the new one.
 * Not synced: after a crash a lost or older baseline only costs the next checkpoint its shortcut.
 */
export async function writeBaseline(file: string, baseline: Baseline): Promise<void> {
  const temp = `${file}.${randomBytes(6).toString('hex')}.tmp`;
  cached.delete(file);
  let identity: string | undefined;
  try {
    await fs.writeFile(temp, JSON.stringify(baseline), { mode: 0o600, flag: 'wx' });
    // Taken before the rename: the file renamed into place is this one, whatever replaces it later.
    identity = await identityOf(temp);
    await fs.rename(temp, file);
  } catch (err) {
    await fs.rm(temp, { force: true });
    throw err;
  }
  // A rename keeps the inode, size and mtime but changes the ctime: the identity is taken again, and
  // kept only if the file in place is still the one written (all but its ctime as before the rename).
  const placed = await identityOf(file);
  const withoutCtime = (id: string | undefined) => id?.slice(0, id.lastIndexOf(':'));
  if (identity !== undefined && placed !== undefined && withoutCtime(placed) === withoutCtime(identity)) {
    remember(file, placed, baseline);
  }
}

export async function removeBaseline(file: string): Promise<void> {
  cached.delete(file);
  await fs.rm(file, { force: true });
}
