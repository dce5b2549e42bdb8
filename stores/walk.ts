import type { BigIntStats, Dirent } from 'node:fs';
// Named, not `import * as`: compiled, a namespace import reads each function through a getter, on
// every one of the walk's several calls per entry.
import {
  chmodSync,
  closeSync,
  constants,
  fstatSync,
  lstatSync,
  openSync,
  readdirSync,
  readlinkSync,
  readSync,
} from 'node:fs';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { hasErrorCode } from './atomic-file';
import { chmodKeepsSetgid, missingOwnerBits, O_PATH, procReady } from './descriptors';
import { isLeased, leaseBreakMs, leasedError } from './leases';
import { hasEscapes, nameFromBytes } from './raw-names';

// Walking a sandbox's checkpoint directories for a checkpoint (the tar.gz archive
// and the content-addressed format alike). Below the top names everything belongs
// to the sandbox, whose processes may swap a directory for a link to a host
// directory while we walk: so the walk goes by descriptor (descriptors.ts), never
// resolving a path inside, and a file's bytes are read from the descriptor its
// entry was made from.
//
// The system calls are synchronous, in slices of at most SLICE_MS between yields
// to the event loop: each asynchronous call is a round trip through libuv's thread
// pool and the event loop, and one at a time they made the walk of 20,000 files
// wait seconds (a profile of a checkpoint showed the main thread idle 24 of 56 s);
// a synchronous lstat or open of a cached inode takes microseconds. Files are opened
// with O_NONBLOCK, so a lease a sandbox process holds never blocks the thread: the
// walk yields `leased` and its caller waits (LeaseWaits). A worker that is not root
// grants itself owner bits the sandbox took away (grantOwner).

/** One entry of the walk, in walk order (a directory before what it holds, names sorted). */
export interface WalkEntry {
  /**
   * `/`-separated, starting with the top name: `workspace/a/b`. A name that is not UTF-8 is held with
   * its bytes escaped (stores/raw-names.ts): give fs `fsPath(path)`, never the string.
   */
  path: string;
  /**
   * `leased`: a file a sandbox process holds a lease on, which cannot be opened yet; the caller waits
   * (LeaseWaits) and asks for the next entry, and the walk tries that file again.
   */
  kind: 'directory' | 'file' | 'symlink' | 'hardlink' | 'leased';
  /** The entry's own metadata (a file's as opened for reading, when it was opened). */
  stat: BigIntStats;
  /** A symlink's target, verbatim (its bytes, escaped as names are); a hardlink's first path in this walk. */
  linkpath?: string;
  /** A file's contents: a descriptor open for reading until the walk moves on (none when `wants` declined it). */
  file?: number;
}

export interface WalkOptions {
  /**
   * Whether a regular file must be opened for its contents, from its lstat (default: every file, and
   * then none is looked at by lstat first). A file declined is never opened: its entry carries that
   * lstat and no descriptor.
   */
  wants?: (entryPath: string, stat: BigIntStats) => boolean;
  /** Ends a wait for a leased file early (walkSandbox), so a cancelled checkpoint stops at once. */
  signal?: AbortSignal;
}

const { S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, S_IRUSR, S_IXUSR } = constants;

/** The longest stretch of synchronous file-system work before the event loop gets a turn (heartbeats, uploads). */
const SLICE_MS = 10;

/** Yields to the event loop once SLICE_MS of synchronous work have passed since the last yield. */
export class Slicer {
  private since = performance.now();
  private calls = 0;

  async pause(): Promise<void> {
    if (this.due()) await this.turn();
  }

  /**
   * Whether the event loop is due a turn: a loop that asks before each step and awaits `turn` only
   * then makes no promise per step (pause makes one each call, ~10% of an unchanged re-suspend's walk).
   */
  due(): boolean {
    // The clock is read every few calls only: reading it costs about what a cached lstat does.
    this.calls += 1;
    return this.calls % 16 === 0 && performance.now() - this.since >= SLICE_MS;
  }

  /** Gives the event loop a turn. */
  async turn(): Promise<void> {
    await new Promise((resolve) => setImmediate(resolve));
    this.since = performance.now();
  }
}

/**
 * The entries of `names` (directories under `rootDir`). A top name that is a
 * symlink to a directory (an active workspace pointing at its host path) is
 * walked as that directory; below it nothing is followed. FIFOs, sockets and
 * devices are left out, as they hold no data of the workspace; a regular file
 * with several links comes once as a file, then as hardlinks to its first path.
 */
export async function* walkSandbox(
  rootDir: string,
  names: readonly string[],
  options: WalkOptions = {},
): AsyncGenerator<WalkEntry> {
  await procReady();
  const slicer = new Slicer();
  const leases = new LeaseWaits(rootDir, names);
  // A synchronous generator inside: each level of an asynchronous one costs every entry promise hops.
  for (const entry of walkSync(rootDir, names, options.wants)) {
    if (entry.kind === 'leased') await leases.wait(entry.path, options.signal);
    else yield entry;
    await slicer.pause();
  }
}

/**
 * The entries walkSandbox yields, from a synchronous generator: for a caller that gives the event loop
 * its turns itself (a Slicer) and awaits only when it must, so an entry it only looks at costs no
 * promise (an asynchronous generator costs each entry several). As there, a file's descriptor is
 * open until the caller asks for the next entry (or ends the loop, which closes it).
 */
export async function walkSandboxSync(
  rootDir: string,
  names: readonly string[],
  options: WalkOptions = {},
): Promise<Generator<WalkEntry>> {
  await procReady();
  return walkSync(rootDir, names, options.wants);
}

function* walkSync(
  rootDir: string,
  names: readonly string[],
  wants: ((entryPath: string, stat: BigIntStats) => boolean) | undefined,
): Generator<WalkEntry> {
  yield* walkTops({ links: new Map(), wants, leasedSkipped: false }, rootDir, names);
}

/**
 * Waits, for one walk, for the kernel to break the leases that keep it from opening files (leases.ts).
 * At the first file found leased, every file of the walk is opened once (breakLeases), which asks the
 * kernel to break every lease there is, so all of them run out together: the walk waits about one
 * break time, however many files are leased. A file still leased past its own break time (from when
 * the walk first found it) and a margin is UNAVAILABLE, naming it.
 */
export class LeaseWaits {
  private broken = false;
  private file: string | undefined;
  private deadline = 0;
  private pause = 1;

  /** `breakMs`: the kernel's break time (read from /proc/sys/fs/lease-break-time by default). */
  constructor(
    private readonly rootDir: string,
    private readonly names: readonly string[],
    private readonly breakMs?: number,
  ) {}

  async wait(file: string, signal?: AbortSignal): Promise<void> {
    if (!this.broken) {
      this.broken = true;
      await breakLeases(this.rootDir, this.names, signal);
    }
    if (file !== this.file) {
      this.file = file;
      this.deadline = Date.now() + (this.breakMs ?? leaseBreakMs()) + LEASE_MARGIN_MS;
      this.pause = 1;
    }
    if (Date.now() > this.deadline) throw leasedError(file, true);
    await delay(this.pause, undefined, signal ? { signal } : {});
    this.pause = Math.min(this.pause * 2, MAX_PAUSE_MS);
  }
}

/** The kernel breaks a lease at the first open after its time: a few polls past it. */
const LEASE_MARGIN_MS = 2_000;
const MAX_PAUSE_MS = 250;

/**
 * Opens (and closes at once, reading nothing) every regular file of `names`, as the walk does: the
 * open of a leased one fails and asks the kernel to break its lease. Which files are leased is not
 * looked up in /proc/locks: a sandbox can fill that file with byte-range locks until reading it takes
 * the worker's thread for tens of seconds, and it names devices as the superblock has them (btrfs
 * subvolumes differ).
 */
async function breakLeases(rootDir: string, names: readonly string[], signal?: AbortSignal): Promise<void> {
  const slicer = new Slicer();
  for (const _entry of walkTops({ links: new Map(), wants: undefined, leasedSkipped: true }, rootDir, names)) {
    signal?.throwIfAborted();
    await slicer.pause();
  }
}

function* walkTops(walk: Walk, rootDir: string, names: readonly string[]): Generator<WalkEntry> {
  for (const name of names) {
    // The top names are the worker's own paths (a link there is the worker's, to a host path): followed.
    const top = openQuiet(path.resolve(rootDir, name), O_PATH);
    if (top === undefined) continue;
    try {
      yield* visit(walk, top, fstatSync(top, { bigint: true }), name);
    } finally {
      closeSync(top);
    }
  }
}

interface Walk {
  /** `dev:ino` of a file with several links → its first path in this walk. */
  links: Map<string, string>;
  /** Undefined: every regular file is opened, and none needs an lstat first. */
  wants: ((entryPath: string, stat: BigIntStats) => boolean) | undefined;
  /** A file that cannot be opened for a lease is passed over (breakLeases), not waited for. */
  leasedSkipped: boolean;
}

/** The entry an O_PATH descriptor `fd` (never followed) holds, whose fstat is `stat`. */
function* visit(walk: Walk, fd: number, stat: BigIntStats, entryPath: string): Generator<WalkEntry> {
  if (stat.isDirectory()) {
    yield { path: entryPath, kind: 'directory', stat };
    // Listed and looked into (read and search) while the walk is in it.
    const restore = grantOwner(fd, stat, S_IRUSR | S_IXUSR);
    try {
      // The listing's types (getdents' d_type) spare most names an lstat: see child.
      const listed = refusedNamed(entryPath, () => readdirSync(magic(fd), { withFileTypes: true }));
      if (listed.some((dirent) => dirent.name.includes(REPLACEMENT))) {
        // A name that is not UTF-8 is listed with U+FFFD in place of its bytes, which opens nothing or
        // another file that has that spelling: the directory is listed again as bytes, and each name
        // kept as its bytes (raw-names.ts). Only then: names as strings are what nearly every
        // directory has, and cheaper (a Buffer per name).
        const raw = refusedNamed(entryPath, () =>
          readdirSync(magic(fd), { withFileTypes: true, encoding: 'buffer' }),
        ).map(named);
        raw.sort(byText);
        for (const { dirent, text, escaped } of raw) {
          yield* child(walk, fd, dirent, text, `${entryPath}/${text}`, escaped ? dirent.name : undefined);
        }
      } else {
        listed.sort(byName);
        for (const dirent of listed)
          yield* child(walk, fd, dirent, dirent.name, `${entryPath}/${dirent.name}`, undefined);
      }
    } finally {
      restore?.();
    }
    return;
  }
  // Not a file, directory or link (a FIFO, socket or device): left out.
  if (!stat.isFile()) return;
  const hardlink = linkedBefore(walk, stat, entryPath);
  if (hardlink) {
    yield hardlink;
    return;
  }
  // Reopened for reading through its own descriptor: the very file `stat` is of (the magic link
  // reaches that inode, wherever it is now), so its stat needs no second look.
  let file = openReadable(fd, stat, entryPath);
  while (file === undefined) {
    if (walk.leasedSkipped) return;
    yield { path: entryPath, kind: 'leased', stat };
    file = openReadable(fd, stat, entryPath);
  }
  try {
    yield { path: entryPath, kind: 'file', stat, file };
  } finally {
    closeSync(file);
  }
}

const REPLACEMENT = '\uFFFD';

/** A listed name (its bytes, as readdir gave them) and its string (raw-names.ts). */
interface Named {
  dirent: Dirent<Buffer>;
  text: string;
  /** The name is not UTF-8: `text` holds escapes, and fs must be given its bytes. */
  escaped: boolean;
}

function named(dirent: Dirent<Buffer>): Named {
  const text = nameFromBytes(dirent.name);
  return { dirent, text, escaped: hasEscapes(text) };
}

/** Names in the order of JavaScript's default sort (UTF-16 code units), which the walk has always had. */
function byName(a: Dirent, b: Dirent): number {
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
}

/** byName for names kept as bytes: the same order of their strings (an escape sorts as its code unit). */
function byText(a: Named, b: Named): number {
  return a.text < b.text ? -1 : a.text > b.text ? 1 : 0;
}

/**
 * The entry `dirent` of the directory `dir` holds. Only what needs it is looked at by lstat: a link
 * (its stat and target are all there is to it), a name whose type the listing does not give, and a
 * regular file the caller may decline (unchanged files are never opened). Anything else is opened
 * with O_PATH, not followed (which opens nothing: a FIFO cannot block, a device sees no open), and
 * its fstat decides. Whatever the listing said, the name may have been swapped since: its fstat tells.
 */
function* child(
  walk: Walk,
  dir: number,
  dirent: Dirent | Dirent<Buffer>,
  name: string,
  entryPath: string,
  /** The name's bytes when it is not UTF-8: reached by them (a string path would be written as U+FFFD). */
  raw: Buffer | undefined,
): Generator<WalkEntry> {
  const where = raw ? rawWhere(dir, raw) : `${magic(dir)}/${name}`;
  // A FIFO, socket or device when listed: left out, as one found later would be.
  if (dirent.isFIFO() || dirent.isSocket() || dirent.isCharacterDevice() || dirent.isBlockDevice()) return;
  if (dirent.isSymbolicLink() || (!dirent.isDirectory() && !dirent.isFile()) || (dirent.isFile() && walk.wants)) {
    // Gone since the listing (renamed or removed meanwhile): not in this checkpoint.
    const seen = lstatQuiet(where);
    if (!seen) return;
    // The type once, as a number: each of BigIntStats' is* methods makes BigInts (every entry, several times).
    const type = Number(seen.mode) & S_IFMT;
    if (type === S_IFLNK) {
      const target = readLink(where);
      if (target !== undefined) yield { path: entryPath, kind: 'symlink', stat: seen, linkpath: target };
      return;
    }
    if (type !== S_IFDIR && type !== S_IFREG) return;
    if (type === S_IFREG && walk.wants) {
      // A regular file whose contents the caller does not need (unchanged since its baseline) is never opened.
      const hardlink = linkedBefore(walk, seen, entryPath);
      if (hardlink) {
        yield hardlink;
        return;
      }
      if (!walk.wants(entryPath, seen)) {
        if (seen.nlink > 1n) walk.links.set(`${seen.dev}:${seen.ino}`, entryPath);
        yield { path: entryPath, kind: 'file', stat: seen };
        return;
      }
    }
  }
  // Swapped meanwhile for a link: O_NOFOLLOW with O_PATH opens the link itself, which fstat tells.
  const fd = openQuiet(where, O_PATH | constants.O_NOFOLLOW);
  if (fd === undefined) return;
  try {
    const stat = fstatSync(fd, { bigint: true });
    if (stat.isSymbolicLink()) {
      const target = readLink(where);
      if (target !== undefined) yield { path: entryPath, kind: 'symlink', stat, linkpath: target };
      return;
    }
    yield* visit(walk, fd, stat, entryPath);
    if (stat.isFile() && stat.nlink > 1n && !walk.links.has(`${stat.dev}:${stat.ino}`)) {
      walk.links.set(`${stat.dev}:${stat.ino}`, entryPath);
    }
  } finally {
    closeSync(fd);
  }
}

/** A hardlink entry if a file with several links was already walked under another path. */
function linkedBefore(walk: Walk, stat: BigIntStats, entryPath: string): WalkEntry | undefined {
  if (stat.nlink <= 1n) return undefined;
  const first = walk.links.get(`${stat.dev}:${stat.ino}`);
  return first === undefined || first === entryPath
    ? undefined
    : { path: entryPath, kind: 'hardlink', stat, linkpath: first };
}

/** `${magic(dir)}/<name>` as bytes, for a name that is not UTF-8. */
function rawWhere(dir: number, name: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`${magic(dir)}/`), name]);
}

/** The magic link of a descriptor: opening it reaches what the descriptor holds, wherever that is now. */
function magic(fd: number): string {
  return `/proc/self/fd/${fd}`;
}

/** The regular file an O_PATH descriptor holds (`stat` its fstat), opened for reading; undefined while a lease stands on it. */
function openReadable(fd: number, stat: BigIntStats, entryPath: string): number | undefined {
  const restore = grantOwner(fd, stat, S_IRUSR);
  try {
    // O_NONBLOCK: a lease (or a FIFO swapped in) must never block the worker's thread.
    return refusedNamed(entryPath, () => openSync(magic(fd), constants.O_RDONLY | constants.O_NONBLOCK));
  } catch (err) {
    if (isLeased(err)) return undefined;
    throw err;
  } finally {
    restore?.();
  }
}

/** Runs `use`; a refusal by the entry's mode (one grantOwner may not change) names the entry, not a descriptor. */
function refusedNamed<T>(entryPath: string, use: () => T): T {
  try {
    return use();
  } catch (err) {
    if (hasErrorCode(err, 'EACCES') || hasErrorCode(err, 'EPERM')) {
      throw new Error(`${entryPath}: its mode refuses the worker, which is not root`, { cause: err });
    }
    throw err;
  }
}

/**
 * A worker that is not root reads sandbox files it owns (a `local` or `bwrap` sandbox runs as the worker's
 * uid) by their owner bits, which the sandbox may have taken away (`chmod 000`): every release then failed
 * with EACCES. The bits are granted through the descriptor (the very directory or regular file fstat
 * saw; the magic link reaches that inode, never a link) for as long as the walk needs them, and the
 * mode set back; the entry keeps the mode it had. Returns what sets it back, if anything was granted.
 * Killed in between, the worker leaves the owner those bits (nothing of the files is lost), and the
 * next checkpoint records them.
 */
function grantOwner(fd: number, stat: BigIntStats, bits: number): (() => void) | undefined {
  const missing = missingOwnerBits(stat, bits);
  // A mode that could not be set back as it was is left as it is (the entry then refuses the worker).
  if (missing === 0 || !chmodKeepsSetgid(stat)) return undefined;
  const mode = Number(stat.mode & 0o7777n);
  chmodSync(magic(fd), mode | missing);
  return () => chmodSync(magic(fd), mode);
}

function openQuiet(where: string | Buffer, flags: number): number | undefined {
  try {
    return openSync(where, flags);
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
}

function lstatQuiet(where: string | Buffer): BigIntStats | undefined {
  try {
    return lstatSync(where, { bigint: true });
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
}

/** A symlink's target, read through its directory's descriptor; undefined if the name is no longer a link. */
function readLink(where: string | Buffer): string | undefined {
  try {
    // As bytes: a target that is not UTF-8 is kept verbatim (raw-names.ts).
    return nameFromBytes(readlinkSync(where, { encoding: 'buffer' }));
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT') || hasErrorCode(err, 'EINVAL')) return undefined;
    throw err;
  }
}

/**
 * Reads exactly `size` bytes of `file` from `position` on into `buffer` (a new one by default);
 * a file that shrank meanwhile fails the checkpoint.
 */
export function readWhole(
  file: number,
  size: number,
  entryPath: string,
  position = 0,
  buffer: Buffer = Buffer.allocUnsafe(size),
): Buffer {
  for (let done = 0; done < size;) {
    const bytesRead = readSync(file, buffer, done, size - done, position + done);
    if (bytesRead === 0) throw new Error(`${entryPath} shrank while it was packed`);
    done += bytesRead;
  }
  return buffer.subarray(0, size);
}

/**
 * Reads exactly `size` bytes of `file` in pieces of at most `piece` bytes; a
 * file that shrank meanwhile fails the checkpoint.
 */
export async function* readExactly(
  file: number,
  size: number,
  entryPath: string,
  piece = 1024 * 1024,
): AsyncGenerator<Buffer> {
  for (let position = 0; position < size; position += piece) {
    yield readWhole(file, Math.min(size - position, piece), entryPath, position);
  }
}
