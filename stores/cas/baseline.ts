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
});
export type Baseline = z.infer<typeof Baseline>;

/**
 * Coarse filesystem clocks lag the wall clock by up to a tick: a file changed
 * this close to the moment its stat was taken is hashed again (git's racy rule).
 */
export const RACY_MARGIN_NS = 50_000_000n;

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

export async function readBaseline(file: string): Promise<Baseline | undefined> {
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
  // Unreadable (an older format, a torn write): only an optimisation is lost.
  try {
    return parseBaseline(JSON.parse(text));
  } catch {
    return undefined;
  }
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
  try {
    await fs.writeFile(temp, JSON.stringify(baseline), { mode: 0o600, flag: 'wx' });
    await fs.rename(temp, file);
  } catch (err) {
    await fs.rm(temp, { force: true });
    throw err;
  }
}

export async function removeBaseline(file: string): Promise<void> {
  await fs.rm(file, { force: true });
}
