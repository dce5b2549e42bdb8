import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { z } from 'zod';
import { hasErrorCode, writeFileAtomic } from '../stores/atomic-file';
import { withLifecycleLock } from './lock';
import { readState, sandboxPathsIn, type Dormant, type SandboxPaths } from './sandbox-state';
import { isMounted, removeSandboxDir, unmountVolume } from './volume';

export { withLifecycleLock } from './lock';

// Host maintenance of dormant copies: the sandbox directories a snapshot release
// left behind for a fast same-host resume. A copy no live record points at is
// deleted after a grace period; under disk pressure copies are evicted (their
// checkpoint in the object store stays the source of truth).

const MARKER_FILE = 'orphan-since.json';
const Marker = z.object({ since: z.string(), checkpointUri: z.string() });

export interface OrphanSweepOptions {
  /** `<dataDir>/sandboxes` of the provider. */
  sandboxesDir: string;
  /** Whether a live record (Run or standalone sandbox) still points at this sandbox on this host. */
  isLive: (sandboxId: string) => Promise<boolean>;
  /** How long a dormant copy stays orphaned before it is deleted; 0 keeps orphans forever. */
  ttlSeconds: number;
  now?: () => Date;
}

export interface OrphanSweepReport {
  /** Orphans seen for the first time (their clock started). */
  marked: string[];
  deleted: string[];
  /** Orphans still within their grace period, or kept because the TTL is 0. */
  waiting: string[];
}

/**
 * Deletes dormant copies that no live record names once they have been orphaned
 * for `ttlSeconds`. The first sighting is written to disk beside the copy, so a
 * worker restart does not restart the clock; liveness is checked again under
 * the sandbox's lifecycle lock right before deleting.
 */
export async function orphanSweep(options: OrphanSweepOptions): Promise<OrphanSweepReport> {
  const now = options.now ?? (() => new Date());
  const report: OrphanSweepReport = { marked: [], deleted: [], waiting: [] };
  for (const copy of await dormantCopies(options.sandboxesDir)) {
    const markerFile = path.join(copy.paths.meta, MARKER_FILE);
    if (await options.isLive(copy.sandboxId)) {
      await fs.rm(markerFile, { force: true });
      continue;
    }
    const marker = await readMarker(markerFile);
    // A marker from an earlier dormant period (another checkpoint) does not count.
    if (!marker || marker.checkpointUri !== copy.dormant.checkpoint.uri) {
      const since = JSON.stringify({ since: now().toISOString(), checkpointUri: copy.dormant.checkpoint.uri });
      const written = await writeFileAtomic(markerFile, since).then(
        () => true,
        (err: unknown) => {
          // Its sandbox was destroyed since the listing: nothing to mark, and the other copies still get their turn.
          if (hasErrorCode(err, 'ENOENT')) return false;
          throw err;
        },
      );
      if (written) report.marked.push(copy.sandboxId);
      continue;
    }
    const orphanedMs = now().getTime() - Date.parse(marker.since);
    if (options.ttlSeconds === 0 || orphanedMs < options.ttlSeconds * 1000) {
      report.waiting.push(copy.sandboxId);
      continue;
    }
    const deleted = await deleteDormantCopy(copy, async () => !(await options.isLive(copy.sandboxId)));
    if (deleted) report.deleted.push(copy.sandboxId);
  }
  return report;
}

export interface EvictOptions {
  sandboxesDir: string;
  /** Evict while the filesystem of `sandboxesDir` has less free space than this. */
  minFreeBytes: number;
  /** Free bytes of the filesystem holding `dir`; statfs by default. */
  freeBytes?: (dir: string) => Promise<number>;
  /** Whether the checkpoint really is in the object store; when given, a copy whose checkpoint is gone is kept. */
  checkpointExists?: (uri: string) => Promise<boolean>;
}

/** Deletes dormant copies (which all have an object-store checkpoint), oldest first, until free space is above `minFreeBytes`. */
export async function evictUnderPressure(options: EvictOptions): Promise<{ evicted: string[]; freeBytes: number }> {
  const freeBytes = options.freeBytes ?? statfsFreeBytes;
  const evicted: string[] = [];
  let free = await freeBytes(options.sandboxesDir);
  if (free >= options.minFreeBytes) return { evicted, freeBytes: free };
  const copies = (await dormantCopies(options.sandboxesDir)).sort(
    (a, b) => Date.parse(a.dormant.since) - Date.parse(b.dormant.since),
  );
  for (const copy of copies) {
    if (free >= options.minFreeBytes) break;
    const checkpointExists = options.checkpointExists;
    const deleted = await deleteDormantCopy(
      copy,
      async () => !checkpointExists || (await checkpointExists(copy.dormant.checkpoint.uri)),
    );
    if (deleted) evicted.push(copy.sandboxId);
    free = await freeBytes(options.sandboxesDir);
  }
  return { evicted, freeBytes: free };
}

async function statfsFreeBytes(dir: string): Promise<number> {
  const stats = await fs.statfs(dir);
  return stats.bavail * stats.bsize;
}

interface DormantCopy {
  sandboxId: string;
  paths: SandboxPaths;
  dormant: Dormant;
}

/** The sandbox directories under `sandboxesDir` (none when it does not exist). */
async function sandboxDirs(sandboxesDir: string): Promise<{ sandboxId: string; paths: SandboxPaths }[]> {
  let names: string[];
  try {
    names = await fs.readdir(sandboxesDir);
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return [];
    throw err;
  }
  return names.flatMap((sandboxId) => {
    try {
      return [{ sandboxId, paths: sandboxPathsIn(sandboxesDir, sandboxId) }];
    } catch {
      return []; // not a sandbox directory
    }
  });
}

async function dormantCopies(sandboxesDir: string): Promise<DormantCopy[]> {
  const copies: DormantCopy[] = [];
  for (const { sandboxId, paths } of await sandboxDirs(sandboxesDir)) {
    const state = await readState(paths).catch(() => undefined);
    if (state?.dormant) copies.push({ sandboxId, paths, dormant: state.dormant });
  }
  return copies;
}

/**
 * Deletes the copy under its lifecycle lock if it is still the same dormant copy
 * (no restore happened meanwhile) and `stillDeletable` agrees.
 */
async function deleteDormantCopy(copy: DormantCopy, stillDeletable: () => Promise<boolean>): Promise<boolean> {
  return withLifecycleLock(copy.sandboxId, async () => {
    const state = await readState(copy.paths).catch(() => undefined);
    if (state?.dormant?.checkpoint.uri !== copy.dormant.checkpoint.uri || state.status !== 'stopped') return false;
    if (!(await stillDeletable())) return false;
    // An active workspace is only a link in the copy: its host files are not touched.
    await removeSandboxDir(copy.paths);
    return true;
  });
}

/**
 * Unmounts the volumes of sandboxes whose compute is released (status `stopped`) that are still
 * mounted: a release unmounts after its receipt (local.ts), which a worker killed in between never
 * did, and a file call on a stopped sandbox mounts it again. Under each sandbox's lifecycle lock; a
 * later call that needs the files mounts them again.
 */
export async function unmountIdleVolumes(sandboxesDir: string): Promise<string[]> {
  const unmounted: string[] = [];
  for (const { sandboxId, paths } of await sandboxDirs(sandboxesDir)) {
    const done = await withLifecycleLock(sandboxId, async () => {
      const state = await readState(paths).catch(() => undefined);
      if (state?.status !== 'stopped' || !(await isMounted(paths).catch(() => false))) return false;
      await unmountVolume(paths);
      return true;
    });
    if (done) unmounted.push(sandboxId);
  }
  return unmounted;
}

async function readMarker(file: string): Promise<z.infer<typeof Marker> | undefined> {
  try {
    return Marker.parse(JSON.parse(await fs.readFile(file, 'utf8')));
  } catch {
    return undefined;
  }
}
