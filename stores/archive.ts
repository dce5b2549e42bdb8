import { createReadStream, lstatSync, statSync, type Stats } from 'node:fs';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { create, extract, Parser, type ReadEntry } from 'tar';
import { StasisError } from '../common/errors';

// Checkpoint archives: a gzipped tar of a sandbox's top directories, written and
// read with node-tar. Restore validates every entry of the whole archive before
// extracting anything, so a hostile archive never writes a single byte.

/** The directories a checkpoint holds, relative to the sandbox root. */
export const CHECKPOINT_DIRS = ['workspace', 'home', 'envs'] as const;

export interface ArchiveLimits {
  /** Total size of the file contents once unpacked (a decompression bomb stops here). */
  maxBytes: number;
  maxEntries: number;
}

export const DEFAULT_ARCHIVE_LIMITS: ArchiveLimits = { maxBytes: 20 * 1024 ** 3, maxEntries: 1_000_000 };

/** Symlink hops followed while checking where a link points (the kernel's own limit). */
const MAX_LINK_HOPS = 40;

/**
 * A tar.gz stream of `names` (directories under `rootDir`): empty directories,
 * symlinks (as links), hardlinks, modes and mtimes preserved. A top-level name
 * that is a symlink to a directory (an active workspace pointing at its host
 * path) is archived as that directory.
 */
export function packSandbox(rootDir: string, names: readonly string[]): Readable {
  // Seeding node-tar's stat cache with the followed stat makes it walk a linked
  // top directory as a directory, while every link inside stays a link.
  const statCache = new Map<string, Stats>();
  const present: string[] = [];
  for (const name of names) {
    const absolute = path.resolve(rootDir, name);
    const own = lstatSafe(absolute);
    if (!own) continue;
    if (own.isSymbolicLink()) statCache.set(absolute, statSync(absolute));
    present.push(name);
  }
  // Level 1: suspend latency matters more than a few percent of object size.
  const pack = create({ cwd: rootDir, gzip: { level: 1 }, strict: true, statCache }, present);
  return Readable.from(pack);
}

function lstatSafe(file: string): Stats | undefined {
  try {
    return lstatSync(file);
  } catch {
    return undefined;
  }
}

/**
 * Checks every entry of `archiveFile`, then extracts it into `targetDir` (which
 * should be empty). Refuses with CHECKPOINT_INVALID, naming the entry, anything
 * that could write outside `targetDir` or exhaust the host.
 */
export async function unpackCheckpoint(
  archiveFile: string,
  targetDir: string,
  limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
): Promise<void> {
  await validateCheckpoint(archiveFile, limits);
  try {
    await extract({
      file: archiveFile,
      cwd: targetDir,
      strict: true,
      preservePaths: false,
      preserveOwner: false,
      // Exact modes from the archive, not filtered through this process's umask.
      chmod: true,
      processUmask: 0,
      // Sizes are bounded by our own limits; gzip of zero-filled files legitimately exceeds node-tar's ratio guard.
      maxDecompressionRatio: Infinity,
      // Validation already refused everything else; this keeps extraction to these types whatever happens.
      filter: (_path, entry) => 'type' in entry && ALLOWED_TYPES.has(entry.type),
    });
  } catch (err) {
    if (err instanceof StasisError) throw err;
    throw new StasisError('CHECKPOINT_INVALID', `checkpoint archive could not be extracted: ${messageOf(err)}`);
  }
}

const ALLOWED_TYPES = new Set(['File', 'OldFile', 'ContiguousFile', 'Directory', 'SymbolicLink', 'Link']);
const FILE_TYPES = new Set(['File', 'OldFile', 'ContiguousFile']);

interface Listing {
  entries: number;
  bytes: number;
  /** Every entry path, normalised, with its type. */
  types: Map<string, string>;
  symlinks: Map<string, string>;
  hardlinks: Map<string, string>;
}

/** Reads the whole archive without writing anything; throws CHECKPOINT_INVALID on the first bad entry. */
export async function validateCheckpoint(
  archiveFile: string,
  limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
): Promise<void> {
  const listing = await listArchive(archiveFile, limits);
  for (const [entryPath, target] of listing.symlinks) {
    const resolved = resolveInArchive(path.posix.dirname(entryPath), target, listing.symlinks);
    if (!resolved.ok) refuse(entryPath, `is a symlink to ${JSON.stringify(target)}, which ${resolved.reason}`);
  }
  for (const entryPath of listing.types.keys()) {
    const through = linkedAncestor(entryPath, listing.symlinks);
    if (through) refuse(entryPath, `would be written through the symlink ${through}`);
  }
  for (const [entryPath, target] of listing.hardlinks) {
    if (!FILE_TYPES.has(listing.types.get(target) ?? '')) {
      refuse(entryPath, `is a hardlink to ${JSON.stringify(target)}, which is not a regular file in the archive`);
    }
  }
}

function listArchive(archiveFile: string, limits: ArchiveLimits): Promise<Listing> {
  const listing: Listing = { entries: 0, bytes: 0, types: new Map(), symlinks: new Map(), hardlinks: new Map() };
  return new Promise((resolve, reject) => {
    const input = createReadStream(archiveFile);
    const parser = new Parser({ strict: true, maxDecompressionRatio: Infinity });
    let failed = false;
    const fail = (err: unknown) => {
      if (failed) return;
      failed = true;
      input.unpipe(parser);
      input.destroy();
      reject(
        err instanceof StasisError
          ? err
          : new StasisError('CHECKPOINT_INVALID', `checkpoint archive is not a valid tar.gz: ${messageOf(err)}`),
      );
    };
    parser.on('entry', (entry: ReadEntry) => {
      try {
        if (!failed) checkEntry(entry, listing, limits);
      } catch (err) {
        fail(err);
      }
      entry.resume();
    });
    parser.on('ignoredEntry', (entry: ReadEntry) =>
      fail(
        new StasisError(
          'CHECKPOINT_INVALID',
          `checkpoint entry ${JSON.stringify(entry.path)} has an unsupported type ${entry.type}`,
        ),
      ),
    );
    parser.on('error', fail);
    parser.on('end', () => {
      if (!failed) resolve(listing);
    });
    input.on('error', fail);
    input.pipe(parser);
  });
}

function checkEntry(entry: ReadEntry, listing: Listing, limits: ArchiveLimits): void {
  const raw = entry.path;
  listing.entries += 1;
  if (listing.entries > limits.maxEntries) {
    refuse(raw, `exceeds the limit of ${limits.maxEntries} entries per checkpoint`);
  }
  if (!ALLOWED_TYPES.has(entry.type)) {
    const kind = { CharacterDevice: 'a character device', BlockDevice: 'a block device', FIFO: 'a FIFO' }[
      entry.type as string
    ];
    refuse(raw, kind ? `is ${kind}` : `has an unsupported type ${entry.type}`);
  }
  const entryPath = normaliseEntryPath(raw);
  if (listing.types.has(entryPath)) refuse(raw, 'appears twice in the archive');
  if (!entryPath.includes('/') && entry.type !== 'Directory') refuse(raw, 'is a top directory but not a directory');
  listing.types.set(entryPath, entry.type);
  if (FILE_TYPES.has(entry.type)) {
    listing.bytes += entry.size;
    if (listing.bytes > limits.maxBytes) {
      refuse(raw, `takes the unpacked size past the limit of ${limits.maxBytes} bytes`);
    }
  }
  if (entry.type === 'SymbolicLink') listing.symlinks.set(entryPath, entry.linkpath ?? '');
  if (entry.type === 'Link') {
    const target = entry.linkpath ?? '';
    if (path.posix.isAbsolute(target) || target.split('/').includes('..')) {
      refuse(raw, `is a hardlink to ${JSON.stringify(target)}, outside the archive`);
    }
    listing.hardlinks.set(entryPath, normaliseEntryPath(target));
  }
}

/** `workspace/a/b` from the raw header path; refuses absolute paths, `..` and anything outside the checkpoint dirs. */
function normaliseEntryPath(raw: string): string {
  if (raw.includes('\0')) refuse(raw, 'contains a NUL byte');
  if (path.posix.isAbsolute(raw) || /^[A-Za-z]:/.test(raw)) refuse(raw, 'is an absolute path');
  const parts = raw.split('/');
  if (parts.includes('..')) refuse(raw, 'contains a ".." segment');
  const kept = parts.filter((part) => part !== '' && part !== '.');
  if (kept.length === 0) refuse(raw, 'has an empty path');
  if (!(CHECKPOINT_DIRS as readonly string[]).includes(kept[0])) {
    refuse(raw, `is outside ${CHECKPOINT_DIRS.map((dir) => `${dir}/`).join(', ')}`);
  }
  return kept.join('/');
}

/**
 * Follows `target` from `fromDir` through the archive's own symlinks, the way the
 * kernel would once extracted, and says whether it stays inside the target dir.
 */
function resolveInArchive(
  fromDir: string,
  target: string,
  symlinks: Map<string, string>,
): { ok: true } | { ok: false; reason: string } {
  if (path.posix.isAbsolute(target)) return { ok: false, reason: 'is an absolute path outside the checkpoint' };
  const resolved = fromDir.split('/').filter(Boolean);
  const pending = target.split('/');
  let hops = 0;
  while (pending.length > 0) {
    const part = pending.shift();
    if (part === undefined || part === '' || part === '.') continue;
    if (part === '..') {
      if (resolved.length === 0) return { ok: false, reason: 'resolves outside the checkpoint' };
      resolved.pop();
      continue;
    }
    resolved.push(part);
    const link = symlinks.get(resolved.join('/'));
    if (link === undefined) continue;
    hops += 1;
    if (hops > MAX_LINK_HOPS) return { ok: false, reason: `passes through more than ${MAX_LINK_HOPS} symlinks` };
    if (path.posix.isAbsolute(link))
      return { ok: false, reason: `leads to the absolute symlink ${resolved.join('/')}` };
    resolved.pop();
    pending.unshift(...link.split('/'));
  }
  return { ok: true };
}

/** The nearest ancestor of `entryPath` that the archive makes a symlink, if any. */
function linkedAncestor(entryPath: string, symlinks: Map<string, string>): string | undefined {
  const parts = entryPath.split('/');
  for (let depth = 1; depth < parts.length; depth += 1) {
    const ancestor = parts.slice(0, depth).join('/');
    if (symlinks.has(ancestor)) return ancestor;
  }
  return undefined;
}

function refuse(entryPath: string, why: string): never {
  throw new StasisError('CHECKPOINT_INVALID', `checkpoint entry ${JSON.stringify(entryPath)} ${why}`);
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
