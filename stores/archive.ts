import { createReadStream, type BigIntStats } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { PassThrough, pipeline, Readable, Transform, type TransformCallback } from 'node:stream';
import { createGzip } from 'node:zlib';
import { Header, Parser, Pax, type ReadEntry } from 'tar';
import { StasisError } from '../common/errors';
import { bytesOfName, hasEscapes, isRawName, shownName } from './raw-names';
import { walkSandbox, readExactly } from './walk';
import { writeKeepingHoles } from './zeros';

// Checkpoint archives: a gzipped tar of a sandbox's top directories. A checkpoint
// reproduces the workspace as packed: files with their modes (setuid and setgid
// stripped), directories, and symlinks recreated verbatim wherever they point.
// One checker (CheckpointChecker) holds the rules; a release applies it to the
// archive it uploads before compute is terminated, and a restore applies it to
// the whole archive before writing anything, then again entry by entry while it
// extracts. Extraction never follows a symlink.

/** The directories a checkpoint holds, relative to the sandbox root. */
export const CHECKPOINT_DIRS = ['workspace', 'home', 'envs'] as const;

export interface ArchiveLimits {
  /** Total size of the file contents once unpacked (a decompression bomb stops here). */
  maxBytes: number;
  maxEntries: number;
}

export const DEFAULT_ARCHIVE_LIMITS: ArchiveLimits = { maxBytes: 20 * 1024 ** 3, maxEntries: 1_000_000 };

/** Longest name of one path component, and of a whole entry path (leaving room for the target directory). */
const MAX_NAME_BYTES = 255;
const MAX_PATH_BYTES = 3072;
/** Longest symlink target the kernel takes. */
const MAX_LINK_BYTES = 4095;

/**
 * A tar.gz stream of `names` (directories under `rootDir`, walked by
 * {@link walkSandbox}): empty directories, symlinks (as links), hardlinks, modes
 * and mtimes preserved; FIFOs, sockets and devices left out.
 */
export function packSandbox(rootDir: string, names: readonly string[], signal?: AbortSignal): Readable {
  // Level 1: suspend latency matters more than a few percent of object size.
  const gzip = createGzip({ level: 1 });
  // A failed walk destroys the gzip stream with its error, which is what the reader sees.
  pipeline(Readable.from(tarBlocks(rootDir, names, signal)), gzip, () => {});
  return gzip;
}

async function* tarBlocks(rootDir: string, names: readonly string[], signal?: AbortSignal): AsyncGenerator<Buffer> {
  for await (const entry of walkSandbox(rootDir, names, signal ? { signal } : {})) {
    // tar headers here are UTF-8: a name or symlink target that is not (kept escaped by the walk) would
    // be written as U+FFFD. Only the content-addressed format holds such names; this one refuses them.
    if (hasEscapes(entry.path) || (entry.linkpath !== undefined && hasEscapes(entry.linkpath))) {
      const which = hasEscapes(entry.path)
        ? 'has a name'
        : entry.kind === 'hardlink'
          ? 'is a hardlink to a name that'
          : 'is a symlink whose target';
      throw invalid(
        shownName(entry.path),
        `${which} is not UTF-8, which a tar.gz checkpoint cannot name (the content-addressed format, written wherever the zstd command is installed, can)`,
      );
    }
    switch (entry.kind) {
      case 'directory':
        yield header({ path: `${entry.path}/`, type: 'Directory', stat: entry.stat, size: 0 });
        break;
      case 'symlink':
      case 'hardlink':
        yield header({
          path: entry.path,
          type: entry.kind === 'symlink' ? 'SymbolicLink' : 'Link',
          stat: entry.stat,
          size: 0,
          ...(entry.linkpath !== undefined ? { linkpath: entry.linkpath } : {}),
        });
        break;
      case 'file': {
        const size = Number(entry.stat.size);
        yield header({ path: entry.path, type: 'File', stat: entry.stat, size });
        if (entry.file !== undefined) yield* readExactly(entry.file, size, entry.path);
        const padding = (512 - (size % 512)) % 512;
        if (padding > 0) yield Buffer.alloc(padding);
        break;
      }
    }
  }
  yield Buffer.alloc(1024);
}

/** One entry's header block (after a pax header when a field does not fit the ustar header). */
function header(entry: {
  path: string;
  type: 'File' | 'Directory' | 'SymbolicLink' | 'Link';
  stat: BigIntStats;
  size: number;
  linkpath?: string;
}): Buffer {
  const { stat } = entry;
  const data = {
    path: entry.path,
    type: entry.type,
    mode: tarMode(Number(stat.mode), entry.type === 'Directory'),
    uid: Number(stat.uid),
    gid: Number(stat.gid),
    size: entry.size,
    // Whole milliseconds, rounded down: rounding up would bring a file of the last half
    // millisecond of a second back one second later.
    mtime: new Date(Number(stat.mtimeNs / 1_000_000n)),
    ...(entry.linkpath !== undefined ? { linkpath: entry.linkpath } : {}),
  };
  const head = new Header(data);
  const needPax = head.encode();
  if (!head.block) throw new Error(`${entry.path}: could not encode its tar header`);
  if (!needPax) return head.block;
  const pax = new Pax({
    path: data.path,
    size: data.size,
    mtime: data.mtime,
    uid: data.uid,
    gid: data.gid,
    ...(data.linkpath !== undefined ? { linkpath: data.linkpath } : {}),
  });
  return Buffer.concat([pax.encode(), head.block]);
}

/** Permission bits as node-tar writes them: a readable directory is also listable. */
function tarMode(mode: number, isDirectory: boolean): number {
  let bits = mode & 0o7777;
  if (isDirectory) {
    if (bits & 0o400) bits |= 0o100;
    if (bits & 0o40) bits |= 0o10;
    if (bits & 0o4) bits |= 0o1;
  }
  return bits;
}

type EntryKind = 'file' | 'directory' | 'symlink' | 'hardlink';

/** An entry that passed the checks, as it is written. */
export interface CheckedEntry {
  /** Normalised, `/`-separated, under one of CHECKPOINT_DIRS: `workspace/a/b`. */
  path: string;
  kind: EntryKind;
  /** Permission bits with setuid and setgid stripped. */
  mode: number;
  mtime: Date | undefined;
  size: number;
  /** A symlink's target, verbatim; a hardlink's target, normalised like `path`. */
  linkpath: string;
}

const KINDS: Record<string, EntryKind> = {
  File: 'file',
  OldFile: 'file',
  ContiguousFile: 'file',
  Directory: 'directory',
  SymbolicLink: 'symlink',
  Link: 'hardlink',
};
const REFUSED_KINDS: Record<string, string> = {
  CharacterDevice: 'a character device',
  BlockDevice: 'a block device',
  FIFO: 'a FIFO',
};

/**
 * The rules of a checkpoint archive, applied entry by entry in archive order
 * ({@link admit}) and to the whole archive at its end ({@link finish}). Refused
 * with CHECKPOINT_INVALID, naming the entry: a path that escapes (absolute, `..`,
 * outside the checkpoint dirs, beneath a symlink or a non-directory of the
 * archive, wherever in the archive that comes), devices, FIFOs and other types,
 * a hardlink to anything but a regular file earlier in the archive, a path twice,
 * and archives past the limits. A symlink may point anywhere: it is recreated,
 * never followed.
 */
export class CheckpointChecker {
  private readonly kinds = new Map<string, EntryKind>();
  /** Entries whose parent was not a directory admitted before them: finish checks their ancestors again. */
  private readonly unsure: string[] = [];
  private bytes = 0;

  constructor(private readonly limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS) {}

  admit(entry: Pick<ReadEntry, 'path' | 'type' | 'mode' | 'mtime' | 'size' | 'linkpath'>): CheckedEntry {
    const raw = entry.path;
    if (this.kinds.size >= this.limits.maxEntries) {
      refuse(raw, `exceeds the limit of ${this.limits.maxEntries} entries per checkpoint`);
    }
    const kind = KINDS[entry.type];
    if (!kind) {
      const named = REFUSED_KINDS[entry.type];
      refuse(raw, named ? `is ${named}` : `has an unsupported type ${entry.type}`);
    }
    const entryPath = normaliseEntryPath(raw);
    if (this.kinds.has(entryPath)) refuse(raw, 'appears twice in the archive');
    const slash = entryPath.lastIndexOf('/');
    if (slash < 0 && kind !== 'directory') refuse(raw, 'is a top directory but not a directory');
    // Beneath a directory admitted before it, an entry lies beneath directories only: each ancestor of
    // that directory is one already (a path comes once) or was checked with it (now and at finish).
    // Walk order, and every manifest, give every entry but the top ones such a parent.
    if (slash >= 0 && this.kinds.get(entryPath.slice(0, slash)) !== 'directory') {
      this.refuseBeneathNonDirectory(entryPath, raw);
      this.unsure.push(entryPath);
    }
    let linkpath = '';
    if (kind === 'symlink') {
      linkpath = entry.linkpath ?? '';
      if (linkpath === '') refuse(raw, 'is a symlink with an empty target');
      if (linkpath.includes('\0')) refuse(raw, 'is a symlink whose target contains a NUL byte');
      if (!isRawName(linkpath)) refuse(raw, `is a symlink whose target ${JSON.stringify(linkpath)} ${NOT_BYTES}`);
      if (bytesOfName(linkpath).length > MAX_LINK_BYTES)
        refuse(raw, `is a symlink whose target is longer than ${MAX_LINK_BYTES} bytes`);
    }
    if (kind === 'hardlink') {
      const target = entry.linkpath ?? '';
      if (path.posix.isAbsolute(target) || target.split('/').includes('..')) {
        refuse(raw, `is a hardlink to ${JSON.stringify(target)}, outside the archive`);
      }
      linkpath = normaliseEntryPath(target);
      const targetKind = this.kinds.get(linkpath);
      if (targetKind !== 'file' && targetKind !== 'hardlink') {
        refuse(raw, `is a hardlink to ${JSON.stringify(target)}, which is not a regular file earlier in the archive`);
      }
    }
    const size = kind === 'file' ? entry.size : 0;
    this.bytes += size;
    if (this.bytes > this.limits.maxBytes) {
      refuse(raw, `takes the unpacked size past the limit of ${this.limits.maxBytes} bytes`);
    }
    this.kinds.set(entryPath, kind);
    const fallbackMode = kind === 'directory' ? 0o755 : 0o644;
    // Setuid and setgid never come back: the restored sandbox must not gain privileges from its own files.
    const mode = (entry.mode ?? fallbackMode) & 0o1777;
    return { path: entryPath, kind, mode, mtime: entry.mtime, size, linkpath };
  }

  /** The checks that need the whole archive: no entry lies beneath a symlink or file that comes later. */
  finish(): void {
    for (const entryPath of this.unsure) this.refuseBeneathNonDirectory(entryPath, entryPath);
  }

  private refuseBeneathNonDirectory(entryPath: string, raw: string): void {
    // Each ancestor is a prefix up to a '/': sliced, not split and joined again (per entry, twice, in every checkpoint).
    for (let slash = entryPath.indexOf('/'); slash >= 0; slash = entryPath.indexOf('/', slash + 1)) {
      const ancestor = entryPath.slice(0, slash);
      const kind = this.kinds.get(ancestor);
      if (kind === undefined || kind === 'directory') continue;
      refuse(
        raw,
        kind === 'symlink'
          ? `would be written through the symlink ${ancestor}`
          : `lies beneath ${ancestor}, which is not a directory`,
      );
    }
  }
}

/** `workspace/a/b` from the raw header path; refuses absolute paths, `..`, overlong names and anything outside the checkpoint dirs. */
export function normaliseEntryPath(raw: string): string {
  return isNormalPath(raw) ? raw : normaliseEntryPathInFull(raw);
}

/**
 * Whether `raw` is already what normaliseEntryPathInFull makes of it and admits: one pass over its characters,
 * for the paths a walk and a well-formed archive give (the rules' hot path: every entry of every
 * checkpoint, an unchanged re-suspend's largest cost after the walk). ASCII only, so its length is
 * its bytes; anything else (a byte past ASCII, an empty, `.` or `..` segment, a NUL, a leading or
 * trailing `/`, a name or path too long, another top directory) goes through the rule in full, which
 * normalises or refuses it. A property test holds the two to the same answers.
 */
function isNormalPath(raw: string): boolean {
  if (raw.length > MAX_PATH_BYTES) return false;
  let start = 0;
  for (let i = 0; i <= raw.length; i += 1) {
    const c = i < raw.length ? raw.charCodeAt(i) : SLASH;
    if (c === 0 || c > 0x7f) return false;
    if (c !== SLASH) continue;
    const length = i - start;
    if (length === 0 || length > MAX_NAME_BYTES) return false;
    // `.` or `..`
    if (raw.charCodeAt(start) === DOT && (length === 1 || (length === 2 && raw.charCodeAt(start + 1) === DOT)))
      return false;
    if (start === 0 && !TOP_DIRS.has(raw.slice(0, i))) return false;
    start = i + 1;
  }
  return true;
}

const SLASH = 0x2f;
const DOT = 0x2e;
const TOP_DIRS: ReadonlySet<string> = new Set(CHECKPOINT_DIRS);

/**
 * A lone surrogate that is not the escape of a byte as a walk makes it (raw-names.ts): outside
 * U+DC80..U+DCFF, or escapes of bytes that are valid UTF-8 where they stand. Such a path spells no
 * bytes, or the bytes of another path, so it names nothing a checkpoint could have taken.
 */
const NOT_BYTES = 'holds a lone surrogate that is no escaped byte of a name';

/** The entry path rule in full, for any string; normaliseEntryPath skips it for paths already normal (tests hold the two to the same answers). */
export function normaliseEntryPathInFull(raw: string): string {
  if (raw.includes('\0')) refuse(raw, 'contains a NUL byte');
  // Checked first: an escape of `/` or `.` (bytes the writer never escapes) must not pass for a name.
  if (!isRawName(raw)) refuse(raw, NOT_BYTES);
  if (path.posix.isAbsolute(raw) || /^[A-Za-z]:/.test(raw)) refuse(raw, 'is an absolute path');
  const parts = raw.split('/');
  if (parts.includes('..')) refuse(raw, 'contains a ".." segment');
  const kept = parts.filter((part) => part !== '' && part !== '.');
  if (kept.length === 0) refuse(raw, 'has an empty path');
  if (!(CHECKPOINT_DIRS as readonly string[]).includes(kept[0])) {
    refuse(raw, `is outside ${CHECKPOINT_DIRS.map((dir) => `${dir}/`).join(', ')}`);
  }
  if (kept.some((part) => bytesOfName(part).length > MAX_NAME_BYTES))
    refuse(raw, `has a name longer than ${MAX_NAME_BYTES} bytes`);
  const joined = kept.join('/');
  if (bytesOfName(joined).length > MAX_PATH_BYTES) refuse(raw, `is longer than ${MAX_PATH_BYTES} bytes`);
  return joined;
}

/** Reads the whole archive without writing anything; throws CHECKPOINT_INVALID on the first bad entry. */
export async function validateCheckpoint(
  archiveFile: string,
  limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
): Promise<void> {
  const checker = new CheckpointChecker(limits);
  await readEntries(createReadStream(archiveFile), async (entry) => {
    checker.admit(entry);
  });
  checker.finish();
}

/**
 * A pass-through for a checkpoint on its way to the store: it fails with
 * CHECKPOINT_INVALID as soon as the archive breaks a rule restore applies, so a
 * release never terminates compute for a checkpoint no restore would take.
 */
export function checkingStream(limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS): Transform {
  const checker = new CheckpointChecker(limits);
  const feed = new PassThrough();
  let failure: unknown;
  const checked = readEntries(feed, async (entry) => {
    checker.admit(entry);
  }).then(
    () => checker.finish(),
    (err: unknown) => {
      failure = err;
      stream.destroy(err as Error);
    },
  );
  const stream = new Transform({
    transform(chunk: Buffer, _encoding, callback: TransformCallback) {
      if (failure) return callback(failure as Error);
      if (feed.write(chunk)) callback(null, chunk);
      else feed.once('drain', () => callback(null, chunk));
    },
    flush(callback: TransformCallback) {
      feed.end();
      checked.then(
        () => callback(failure as Error | undefined),
        (err: unknown) => callback(err as Error),
      );
    },
  });
  return stream;
}

/**
 * Checks every entry of `archiveFile`, then extracts it into `targetDir` (which
 * must be empty). Refuses with CHECKPOINT_INVALID, naming the entry, anything
 * that could write outside `targetDir` or exhaust the host, before writing
 * anything. Any other failure (a full disk, an I/O error) is thrown as it is:
 * the checkpoint is fine and a retry may succeed.
 */
export async function unpackCheckpoint(
  archiveFile: string,
  targetDir: string,
  limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
): Promise<void> {
  await validateCheckpoint(archiveFile, limits);
  const checker = new CheckpointChecker(limits);
  const target = path.resolve(targetDir);
  const directories: CheckedEntry[] = [];
  const knownDirs = new Set<string>([target]);
  await readEntries(createReadStream(archiveFile), async (raw) => {
    // The same rules again, entry by entry, right before each write.
    const entry = checker.admit(raw);
    const absolute = path.join(target, ...entry.path.split('/'));
    await ensureParents(target, absolute, knownDirs);
    await writeEntry(target, absolute, entry, raw);
    if (entry.kind === 'directory') {
      knownDirs.add(absolute);
      directories.push(entry);
    }
  });
  // Modes and mtimes of directories last (writing into a directory changes its mtime), deepest first.
  directories.sort((a, b) => b.path.split('/').length - a.path.split('/').length);
  for (const dir of directories) {
    const absolute = path.join(target, ...dir.path.split('/'));
    await fs.chmod(absolute, dir.mode);
    if (dir.mtime) await fs.utimes(absolute, dir.mtime, dir.mtime);
  }
}

/** Creates the missing parents of `absolute` below `target`; an existing parent must be a real directory, never a link. */
async function ensureParents(target: string, absolute: string, knownDirs: Set<string>): Promise<void> {
  const missing: string[] = [];
  for (let dir = path.dirname(absolute); !knownDirs.has(dir); dir = path.dirname(dir)) {
    if (dir.length <= target.length) throw new Error(`${absolute} is not below ${target}`);
    missing.unshift(dir);
  }
  for (const dir of missing) {
    try {
      await fs.mkdir(dir, { mode: 0o755 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      if (!(await fs.lstat(dir)).isDirectory()) refuse(path.relative(target, dir), 'is not a directory');
    }
    knownDirs.add(dir);
  }
}

const NEW_FILE = fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW;

/** Writes one entry; nothing may exist at its path yet (O_EXCL, symlink(2) and link(2) never follow the new name). */
async function writeEntry(target: string, absolute: string, entry: CheckedEntry, data: ReadEntry): Promise<void> {
  switch (entry.kind) {
    case 'directory':
      try {
        await fs.mkdir(absolute, { mode: 0o700 });
      } catch (err) {
        // A directory an earlier entry implied; anything else there (a link) is refused.
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || !(await fs.lstat(absolute)).isDirectory()) {
          refuse(entry.path, 'is a directory where the archive already put something else');
        }
      }
      return;
    case 'file': {
      const handle = await fs.open(absolute, NEW_FILE, 0o600);
      try {
        // Its bytes so far (holes included), and the end of the last ones written: blocks of zeros are left holes (stores/zeros.ts).
        let written = 0;
        let end = 0;
        for await (const chunk of data as AsyncIterable<Buffer>) {
          const last = await writeKeepingHoles(handle, chunk, written);
          if (last > written) end = last;
          written += chunk.length;
        }
        // A short write (a full disk can end one without an error) must never pass for the whole file.
        if (written !== entry.size) throw new Error(`${absolute}: wrote ${written} of ${entry.size} bytes`);
        if (end < written) await handle.truncate(written);
        await handle.chmod(entry.mode);
        if (entry.mtime) await handle.utimes(entry.mtime, entry.mtime);
      } finally {
        await handle.close();
      }
      return;
    }
    case 'symlink':
      await fs.symlink(entry.linkpath, absolute);
      if (entry.mtime) await fs.lutimes(absolute, entry.mtime, entry.mtime);
      return;
    case 'hardlink':
      // link(2) does not follow a symlink at the source; the checker made sure it is a regular file anyway.
      await fs.link(path.join(target, ...entry.linkpath.split('/')), absolute);
      return;
  }
}

/**
 * Feeds `source` through a tar parser and hands each entry to `onEntry`, in
 * order, and settles once every `onEntry` has. A malformed archive is
 * CHECKPOINT_INVALID; an error reading `source` or from `onEntry` is thrown as it is.
 */
function readEntries(source: Readable, onEntry: (entry: ReadEntry) => Promise<void>): Promise<void> {
  return new Promise((resolve, reject) => {
    const parser = new Parser({ strict: true, maxDecompressionRatio: Infinity });
    let failed = false;
    const fail = (err: unknown) => {
      if (failed) return;
      failed = true;
      source.unpipe(parser);
      source.destroy();
      reject(err);
    };
    // The parser hands out the next entry (and ends) once an entry's data is read, which may be before
    // `onEntry` is done with it (a file's last write): the end waits for every entry, not only the last.
    let current: Promise<void> = Promise.resolve();
    parser.on('entry', (entry: ReadEntry) => {
      if (failed) {
        entry.resume();
        return;
      }
      const settled = onEntry(entry).then(
        () => {
          entry.resume();
        },
        (err: unknown) => {
          fail(err);
          entry.resume();
        },
      );
      current = current.then(() => settled);
    });
    parser.on('ignoredEntry', (entry: ReadEntry) => {
      fail(invalid(entry.path, `has an unsupported type ${entry.type}`));
    });
    parser.on('error', (err: unknown) =>
      fail(
        err instanceof StasisError
          ? err
          : new StasisError('CHECKPOINT_INVALID', `checkpoint archive is not a valid tar.gz: ${messageOf(err)}`),
      ),
    );
    parser.on('end', () => {
      void current.then(() => {
        if (!failed) resolve();
      });
    });
    source.on('error', fail);
    source.pipe(parser);
  });
}

function invalid(entryPath: string, why: string): StasisError {
  return new StasisError('CHECKPOINT_INVALID', `checkpoint entry ${JSON.stringify(entryPath)} ${why}`);
}

function refuse(entryPath: string, why: string): never {
  throw invalid(entryPath, why);
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
