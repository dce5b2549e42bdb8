import { randomUUID } from 'node:crypto';
import { constants, type Stats } from 'node:fs';
import * as fs from 'node:fs/promises';
import { StasisError } from '../common/errors';
import { FILE_LIMIT_BYTES } from '../common/payload-limits';
import { hasErrorCode } from '../stores/atomic-file';
import { at, magic, missingOwnerBits, O_PATH, openBeneath, procReady, type Opened } from '../stores/descriptors';
import { isLeased, leasedError } from '../stores/leases';

// File access to a sandbox's workspace from outside it, for anyone (REST, MCP,
// a Run's readFile/writeFile steps). Every name in the workspace belongs to the
// sandbox, whose processes may rename and relink them while we look: so no path
// inside it is ever resolved by the kernel on the host. We walk it one name at a
// time from a descriptor of the directory before, never following a symlink
// (stores/descriptors.ts says how), and touch only regular files.

/** Largest file readFile hands back: what a file call carries through a Temporal payload. */
const MAX_FILE_BYTES = FILE_LIMIT_BYTES;

/** Prefix of the temp file a write renames into place (in the same directory). */
const TEMP_PREFIX = '.stasis-write-';
const LINK = 'is a symlink, which file access never follows';

export async function readWorkspaceFile(workspace: string, requested: string): Promise<Buffer> {
  const names = namesOf(requested);
  return withParent(workspace, names, requested, false, async (parent) => {
    const leaf = await step(parent, names[names.length - 1], requested);
    if (!leaf) throw notFound(requested);
    try {
      assertRegular(leaf.stat, requested, names);
      if (leaf.stat.size > MAX_FILE_BYTES) throw tooLarge(requested, `${leaf.stat.size} bytes is`);
      // O_NONBLOCK: a lease a sandbox process holds on it must not hold one of the worker's threads (leases.ts).
      const file = await fs
        .open(magic(leaf.handle), constants.O_RDONLY | constants.O_NONBLOCK)
        .catch((err: unknown) => {
          throw isLeased(err) ? leasedError(requested) : fileError(err, requested);
        });
      try {
        return await readBounded(file, leaf.stat.size, requested);
      } finally {
        await file.close();
      }
    } finally {
      await leaf.handle.close();
    }
  });
}

/**
 * Writes `content` to `requested`, creating missing directories; readers see the
 * old content or the new, never part of it (a temp file renamed into place).
 * Replacing a file keeps its permission bits, without setuid/setgid.
 */
export async function writeWorkspaceFile(workspace: string, requested: string, content: Buffer): Promise<void> {
  const names = namesOf(requested);
  const name = names[names.length - 1];
  await withParent(workspace, names, requested, true, async (parent) => {
    const existing = await step(parent, name, requested);
    let mode: number | undefined;
    if (existing) {
      await existing.handle.close();
      assertRegular(existing.stat, requested, names);
      mode = existing.stat.mode & 0o777;
    }
    const temp = at(parent, `${TEMP_PREFIX}${randomUUID()}`);
    try {
      const file = await fs.open(
        temp,
        constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      );
      try {
        await file.writeFile(content);
        if (mode !== undefined) await file.chmod(mode);
      } finally {
        await file.close();
      }
      // rename() never follows the last name: a link put there meanwhile is replaced, not written through.
      await fs.rename(temp, at(parent, name));
    } catch (err) {
      await fs.unlink(temp).catch(() => undefined);
      throw fileError(err, requested);
    }
  });
}

/** The names of `requested` inside the workspace; refused up front if any could leave it. */
function namesOf(requested: string): string[] {
  const relative = requested.startsWith('/workspace/') ? requested.slice('/workspace/'.length) : requested;
  if (relative.startsWith('/') || relative.includes('\0')) {
    throw invalid(requested, 'must be relative to the workspace');
  }
  const names = relative.split('/').filter((name) => name !== '' && name !== '.');
  if (names.includes('..')) {
    throw invalid(requested, 'must not contain ".."');
  }
  if (names.length === 0) {
    throw invalid(requested, 'names the workspace itself');
  }
  return names;
}

/**
 * Opens the directory that holds the last of `names` (creating missing ones when
 * `create`), runs `use` with it, and closes every descriptor it opened.
 */
async function withParent<T>(
  workspace: string,
  names: string[],
  requested: string,
  create: boolean,
  use: (parent: fs.FileHandle) => Promise<T>,
): Promise<T> {
  await procReady();
  // The root is the worker's own path (an active workspace's is the worker's link to its host path): followed.
  // Only the current directory stays open: a deep path must not hold one descriptor per name (thousands of them).
  let dir = await fs.open(workspace, O_PATH | constants.O_DIRECTORY);
  try {
    for (let i = 0; i < names.length - 1; i++) {
      let next = await step(dir, names[i], requested);
      if (!next && create) {
        // mkdir() never follows the last name either; a link that wins the race is refused just below.
        await fs.mkdir(at(dir, names[i])).catch((err: unknown) => {
          if (!hasErrorCode(err, 'EEXIST')) throw fileError(err, requested);
        });
        next = await step(dir, names[i], requested);
      }
      if (!next) throw notFound(requested);
      await dir.close();
      dir = next.handle;
      if (!next.stat.isDirectory()) {
        const prefix = names.slice(0, i + 1).join('/');
        throw invalid(requested, `${prefix} ${next.stat.isSymbolicLink() ? LINK : 'is not a directory'}`);
      }
    }
    return await use(dir);
  } finally {
    await dir.close();
  }
}

/**
 * Removes `root` and everything beneath it without following any link inside:
 * a sandbox process that outlived its kill may swap a directory for a link to a
 * host directory while we walk, and a path-based recursive remove would then
 * delete the host's files. `root` is the worker's own path; a link there is
 * removed as a link. Each directory is emptied through its own descriptor.
 */
export async function removeTree(root: string): Promise<void> {
  const stat = await fs.lstat(root).catch((err: unknown) => {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  });
  if (!stat) return;
  if (!stat.isDirectory()) return fs.rm(root, { force: true });
  await procReady();
  const handle = await fs.open(root, O_PATH | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  try {
    await emptyDirectory(handle, stat, { top: handle, moved: 0 }, 0);
  } finally {
    await handle.close();
  }
  await fs.rmdir(root).catch((err: unknown) => {
    if (!hasErrorCode(err, 'ENOENT')) throw err;
  });
}

/** Rounds of emptying a directory whose entries keep changing before giving up. */
const REMOVE_ROUNDS = 100;
/**
 * Directories held open at once below the top of a removal. A directory deeper is moved up to the top
 * instead (a rename on the same filesystem, following nothing) and emptied from there: one descriptor
 * per level of a sandbox's 21,000 nested directories ran the worker out of descriptors (EMFILE for
 * every other open in it), and every destroy of that sandbox failed.
 */
const MAX_OPEN_DEPTH = 64;

/** One removal: its top directory, and how many directories it moved up there (each one round of work more). */
interface Removal {
  top: fs.FileHandle;
  moved: number;
}

async function emptyDirectory(dir: fs.FileHandle, stat: Stats, removal: Removal, depth: number): Promise<void> {
  await grantRemoval(dir, stat);
  // The top's rounds also empty what deeper levels moved up to it.
  for (let round = 0; round < REMOVE_ROUNDS + (depth === 0 ? removal.moved : 0); round++) {
    // As bytes: a name that is not UTF-8, decoded, names another entry or none (and was never removed).
    const names = await fs.readdir(magic(dir), { encoding: 'buffer' });
    if (names.length === 0) return;
    for (const name of names) {
      // unlink() and rmdir() never follow the last name: a link is removed as a link.
      const unlinked = await fs.unlink(at(dir, name)).then(
        () => true,
        (err: unknown) => {
          if (hasErrorCode(err, 'ENOENT')) return true;
          if (hasErrorCode(err, 'EISDIR') || hasErrorCode(err, 'EPERM')) return false;
          throw err;
        },
      );
      if (unlinked) continue;
      if (depth + 1 >= MAX_OPEN_DEPTH && (await movedUp(dir, name, removal))) continue;
      const child = await step(dir, name, name.toString());
      if (!child) continue;
      try {
        if (child.stat.isDirectory()) await emptyDirectory(child.handle, child.stat, removal, depth + 1);
      } finally {
        await child.handle.close();
      }
      // Swapped or refilled meanwhile: the next round sees what is there now.
      await fs.rmdir(at(dir, name)).catch((err: unknown) => {
        if (!['ENOENT', 'ENOTDIR', 'ENOTEMPTY', 'EEXIST'].some((code) => hasErrorCode(err, code))) throw err;
      });
    }
  }
  throw new StasisError('UNAVAILABLE', `directory ${magic(dir)}: its entries kept changing while it was removed`);
}

/**
 * Listed, looked into, emptied or moved by a worker that is not root: a directory's owner bits, should the
 * sandbox have taken them (a read-only Go module cache). Never set back: the directory goes.
 */
async function grantRemoval(dir: fs.FileHandle, stat: Stats): Promise<void> {
  const missing = missingOwnerBits(stat, constants.S_IRWXU);
  if (missing !== 0) await fs.chmod(magic(dir), (stat.mode & 0o7777) | missing);
}

/**
 * Moves the directory `name` of `dir` up to the top of the removal (MAX_OPEN_DEPTH), to be emptied from
 * there; true if it is gone from `dir`, false to descend into it instead (not a directory, or the top is
 * on another filesystem).
 */
async function movedUp(dir: fs.FileHandle, name: Buffer, removal: Removal): Promise<boolean> {
  const child = await step(dir, name, name.toString());
  if (!child) return true;
  try {
    if (!child.stat.isDirectory()) return false;
    // Moving a directory rewrites its `..`, for which it must be writable.
    await grantRemoval(child.handle, child.stat);
  } finally {
    await child.handle.close();
  }
  // rename() never follows either name: whatever the name holds by now moves, a link as a link.
  return fs.rename(at(dir, name), at(removal.top, `.stasis-removing-${randomUUID()}`)).then(
    () => {
      removal.moved += 1;
      return true;
    },
    (err: unknown) => {
      if (hasErrorCode(err, 'ENOENT')) return true;
      if (hasErrorCode(err, 'EXDEV')) return false;
      throw err;
    },
  );
}

/** Opens `name` in `dir` without following it or opening what it is; undefined if there is none. */
async function step(dir: fs.FileHandle, name: string | Buffer, requested: string): Promise<Opened | undefined> {
  try {
    return await openBeneath(dir, name);
  } catch (err) {
    throw fileError(err, requested);
  }
}

function assertRegular(stat: Stats, requested: string, names: string[]): void {
  if (stat.isFile()) return;
  const what = stat.isDirectory()
    ? 'is a directory'
    : stat.isSymbolicLink()
      ? `${names.join('/')} ${LINK}`
      : `is not a regular file (a ${stat.isFIFO() ? 'FIFO' : stat.isSocket() ? 'socket' : 'device'})`;
  throw invalid(requested, what);
}

/** Reads to the end, but never more than MAX_FILE_BYTES (the file may have grown since its `size`). */
async function readBounded(file: fs.FileHandle, size: number, requested: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for (;;) {
    const room = Math.min(Math.max(size + 1 - total, 64 * 1024), MAX_FILE_BYTES + 1 - total);
    const { bytesRead, buffer } = await file.read(Buffer.allocUnsafe(room), 0, room);
    if (bytesRead === 0) return Buffer.concat(chunks, total);
    total += bytesRead;
    if (total > MAX_FILE_BYTES) throw tooLarge(requested, 'it has grown to');
    chunks.push(buffer.subarray(0, bytesRead));
  }
}

function invalid(requested: string, why: string): StasisError {
  return new StasisError('INVALID_ARGUMENT', `path ${JSON.stringify(requested)}: ${why}`);
}

function notFound(requested: string): StasisError {
  return new StasisError('NOT_FOUND', `path ${JSON.stringify(requested)}: no such file in the workspace`);
}

function tooLarge(requested: string, what: string): StasisError {
  return new StasisError(
    'PAYLOAD_TOO_LARGE',
    `path ${JSON.stringify(requested)}: ${what} more than ${MAX_FILE_BYTES} bytes`,
  );
}

function fileError(err: unknown, requested: string): Error {
  if (err instanceof StasisError) return err;
  if (hasErrorCode(err, 'ENOENT')) return notFound(requested);
  if (hasErrorCode(err, 'EISDIR')) return invalid(requested, 'is a directory');
  if (hasErrorCode(err, 'ENAMETOOLONG')) return invalid(requested, 'a name in it is too long');
  // A worker that is not root, held back by modes the sandbox set on its own files (never changed for a read or write).
  if (hasErrorCode(err, 'EACCES') || hasErrorCode(err, 'EPERM')) {
    return invalid(requested, 'its permissions, or a directory’s on the way, refuse the worker (which is not root)');
  }
  if (hasErrorCode(err, 'ENOSPC') || hasErrorCode(err, 'EDQUOT')) {
    return new StasisError(
      'PAYLOAD_TOO_LARGE',
      `${requested}: no room left for it in the sandbox's disk limit (diskMiB)`,
    );
  }
  return err instanceof Error ? err : new Error(String(err));
}
