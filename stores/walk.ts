import type { BigIntStats } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { hasErrorCode } from './atomic-file';
import { at, magic, O_PATH, openBeneath, procReady } from './descriptors';

// Walking a sandbox's checkpoint directories for a checkpoint (the tar.gz archive
// and the content-addressed format alike). Below the top names everything belongs
// to the sandbox, whose processes may swap a directory for a link to a host
// directory while we walk: so the walk goes by descriptor (descriptors.ts), never
// resolving a path inside, and a file's bytes are read from the descriptor its
// entry was made from.

/** One entry of the walk, in walk order (a directory before what it holds, names sorted). */
export interface WalkEntry {
  /** `/`-separated, starting with the top name: `workspace/a/b`. */
  path: string;
  kind: 'directory' | 'file' | 'symlink' | 'hardlink';
  /** The entry's own metadata (a file's as opened for reading). */
  stat: BigIntStats;
  /** A symlink's target, verbatim; a hardlink's first path in this walk. */
  linkpath?: string;
  /** A file's contents, open for reading until the walk moves on. */
  file?: fs.FileHandle;
}

/**
 * The entries of `names` (directories under `rootDir`). A top name that is a
 * symlink to a directory (an active workspace pointing at its host path) is
 * walked as that directory; below it nothing is followed. FIFOs, sockets and
 * devices are left out, as they hold no data of the workspace; a regular file
 * with several links comes once as a file, then as hardlinks to its first path.
 */
export async function* walkSandbox(rootDir: string, names: readonly string[]): AsyncGenerator<WalkEntry> {
  await procReady();
  const links = new Map<string, string>();
  for (const name of names) {
    // The top names are the worker's own paths (a link there is the worker's, to a host path): followed.
    const top = await openTop(path.resolve(rootDir, name));
    if (!top) continue;
    try {
      yield* walkEntry(top, name, links);
    } finally {
      await top.close();
    }
  }
}

async function openTop(absolute: string): Promise<fs.FileHandle | undefined> {
  try {
    return await fs.open(absolute, O_PATH);
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
}

async function* walkEntry(
  handle: fs.FileHandle,
  entryPath: string,
  links: Map<string, string>,
): AsyncGenerator<WalkEntry> {
  const stat = await handle.stat({ bigint: true });
  if (stat.isDirectory()) {
    yield { path: entryPath, kind: 'directory', stat };
    for (const name of (await fs.readdir(magic(handle))).sort()) {
      // Gone since the listing (renamed or removed meanwhile): not in this checkpoint.
      const child = await openBeneath(handle, name);
      if (!child) continue;
      try {
        if (child.stat.isSymbolicLink()) {
          const target = await readLink(handle, name);
          if (target !== undefined) {
            const linkStat = await child.handle.stat({ bigint: true });
            yield { path: `${entryPath}/${name}`, kind: 'symlink', stat: linkStat, linkpath: target };
          }
        } else {
          yield* walkEntry(child.handle, `${entryPath}/${name}`, links);
        }
      } finally {
        await child.handle.close();
      }
    }
    return;
  }
  // Not a file, directory or link (a FIFO, socket or device): left out.
  if (!stat.isFile()) return;
  const inode = `${stat.dev}:${stat.ino}`;
  const first = stat.nlink > 1n ? links.get(inode) : undefined;
  if (first !== undefined) {
    yield { path: entryPath, kind: 'hardlink', stat, linkpath: first };
    return;
  }
  // Reopened for reading through its own descriptor: the very file just looked at, wherever it is now.
  const file = await fs.open(magic(handle), fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  try {
    const opened = await file.stat({ bigint: true });
    if (!opened.isFile() || opened.ino !== stat.ino || opened.dev !== stat.dev) {
      throw new Error(`${entryPath} changed while it was packed`);
    }
    yield { path: entryPath, kind: 'file', stat: opened, file };
  } finally {
    await file.close();
  }
  if (stat.nlink > 1n) links.set(inode, entryPath);
}

/** A symlink's target, read through its directory's descriptor; undefined if the name is no longer a link. */
async function readLink(dir: fs.FileHandle, name: string): Promise<string | undefined> {
  try {
    return await fs.readlink(at(dir, name));
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT') || hasErrorCode(err, 'EINVAL')) return undefined;
    throw err;
  }
}

/**
 * Reads exactly `size` bytes of `file` from `position` on in pieces of at most
 * `piece` bytes; a file that shrank meanwhile fails the checkpoint.
 */
export async function* readExactly(
  file: fs.FileHandle,
  size: number,
  entryPath: string,
  piece = 1024 * 1024,
): AsyncGenerator<Buffer> {
  let position = 0;
  while (position < size) {
    const length = Math.min(size - position, piece);
    const { bytesRead, buffer } = await file.read(Buffer.allocUnsafe(length), 0, length, position);
    if (bytesRead === 0) throw new Error(`${entryPath} shrank while it was packed`);
    position += bytesRead;
    yield buffer.subarray(0, bytesRead);
  }
}
