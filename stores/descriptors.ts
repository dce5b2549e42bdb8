import { constants, type Stats } from 'node:fs';
import * as fs from 'node:fs/promises';
import { StasisError } from '../common/errors';
import { hasErrorCode } from './atomic-file';

// Walking a tree that someone else may rename and relink while we look (a
// sandbox's files) without ever following a link of theirs: one name at a time,
// from a descriptor of the directory before.
//
// Node has no openat(), so each step opens `/proc/self/fd/<dirfd>/<name>`. The
// kernel jumps from that magic link straight to the directory the descriptor
// holds (whatever its path has become since) and then looks up one name, which
// must be neither `..` nor `.` and have no `/`; O_NOFOLLOW refuses it if it is a
// symlink. Every step opens with O_PATH, which opens nothing (a FIFO cannot
// block, a device sees no open) and lets the caller fstat what it got before
// deciding; a regular file is then reopened for reading through its own
// descriptor's magic link. Race-free in pure Node on any Linux; openat2
// (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) would need a native helper for the same.

/** Linux's O_PATH (the same on x86-64 and arm64); Node does not export it. */
export const O_PATH = 0o10000000;

/** An entry opened with O_PATH (never followed), and what it is. */
export interface Opened {
  handle: fs.FileHandle;
  stat: Stats;
}

/**
 * Opens `name` in the directory `dir` holds without following it or opening what
 * it is; undefined if there is none. Other errors are thrown as they are.
 */
export async function openBeneath(dir: fs.FileHandle, name: string | Buffer): Promise<Opened | undefined> {
  const spelled = name.toString();
  if (spelled === '' || spelled === '.' || spelled === '..' || name.includes('/')) {
    throw new StasisError('INVALID_ARGUMENT', `${JSON.stringify(spelled)} is not one name in a directory`);
  }
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(at(dir, name), O_PATH | constants.O_NOFOLLOW);
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
  try {
    return { handle, stat: await handle.stat() };
  } catch (err) {
    await handle.close();
    throw err;
  }
}

/**
 * The path that looks `name` up in the directory `dir` holds, whatever its path is now. A name as the
 * directory's listing gives it in bytes (one that is not UTF-8) stays bytes: as a string it would be
 * another name.
 */
export function at(dir: fs.FileHandle, name: string): string;
export function at(dir: fs.FileHandle, name: string | Buffer): string | Buffer;
export function at(dir: fs.FileHandle, name: string | Buffer): string | Buffer {
  return typeof name === 'string' ? `${magic(dir)}/${name}` : Buffer.concat([Buffer.from(`${magic(dir)}/`), name]);
}

/** The magic link of a descriptor: opening it reaches what the descriptor holds, wherever that is now. */
export function magic(handle: fs.FileHandle): string {
  return `/proc/self/fd/${handle.fd}`;
}

let procChecked: Promise<void> | undefined;
/** Walking by descriptor relies on /proc's descriptor links; without them it refuses rather than guess. */
export function procReady(): Promise<void> {
  procChecked ??= fs.stat('/proc/self/fd').then(
    () => undefined,
    () => {
      procChecked = undefined;
      throw new StasisError('NOT_SUPPORTED', 'access to sandbox files needs /proc mounted on the worker’s host');
    },
  );
  return procChecked;
}

/**
 * Of the owner `bits` (S_IRUSR, S_IWUSR, S_IXUSR), those a worker that is not root must grant itself on an
 * entry it owns before it can use it that way (0 if none, or if it is root, or the entry is not its own).
 * Under `local` and `bwrap` a sandbox runs as the worker's uid, owns its files, and may take their owner
 * bits away (`chmod 000`; Go's module cache is read-only, 0555): root is not held back by them, others are.
 */
export function missingOwnerBits(stat: { uid: number | bigint; mode: number | bigint }, bits: number): number {
  if (EUID === 0 || Number(stat.uid) !== EUID) return 0;
  return bits & ~Number(stat.mode);
}

/**
 * Whether a chmod by this process would keep the entry's set-group-ID bit: the kernel clears it on any
 * chmod by a process not in the entry's group (and without CAP_FSETID), so a mode granted and set back
 * would not be the one it was.
 */
export function chmodKeepsSetgid(stat: { gid: number | bigint; mode: number | bigint }): boolean {
  return (Number(stat.mode) & S_ISGID) === 0 || EUID === 0 || ownGroup(Number(stat.gid));
}

/** The worker's effective uid, asked once (it never changes it): the walk asks for every file and directory. */
const EUID = process.geteuid?.() ?? 0;

/** The set-group-ID bit (Node's constants lack it). */
const S_ISGID = 0o2000;

function ownGroup(gid: number): boolean {
  return process.getegid?.() === gid || (process.getgroups?.() ?? []).includes(gid);
}
