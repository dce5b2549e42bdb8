import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';

// The one way Stasis writes a file that guards exactly-once (receipts, the job
// journal, sandbox state, fs-store objects): readers and a crash see the old
// content or the new one, never a torn write, and a failed write leaves nothing.

/** Temp files are `<file>.tmp-<random>`, beside the file. */
const TEMP_MARK = '.tmp-';

/**
 * Writes `file` atomically and durably: a temp file beside it, fsync, rename,
 * fsync of the directory. A failed or cancelled write removes its temp file and
 * leaves `file` as it was.
 */
export async function writeFileAtomic(
  file: string,
  data: string | Buffer | Readable,
  options: { signal?: AbortSignal } = {},
): Promise<void> {
  await (await stageFileAtomic(file, data, options)).commit();
}

/** A write of writeFileAtomic's whose content is durable beside its name: commit() gives it the name. */
export interface StagedFile {
  /** Renames the temp file into place and fsyncs the directory (a failed rename removes it). */
  commit(): Promise<void>;
  /** Removes the temp file; `file` stays as it was. */
  abort(): Promise<void>;
}

/**
 * The first half of writeFileAtomic: the temp file written and fsynced, not yet named. Lets a caller
 * sync a write while another one it must follow is synced (a release's receipt while the sandbox's
 * raised fence is saved), and still give it its name only after that one is durable.
 */
export async function stageFileAtomic(
  file: string,
  data: string | Buffer | Readable,
  options: { signal?: AbortSignal } = {},
): Promise<StagedFile> {
  const temp = `${file}${TEMP_MARK}${randomBytes(6).toString('hex')}`;
  const abort = () => fs.rm(temp, { force: true });
  try {
    const handle = await fs.open(temp, 'wx', 0o600);
    try {
      if (data instanceof Readable) await writeStream(handle, data, options.signal);
      else await handle.writeFile(data);
      await handle.sync();
    } finally {
      await handle.close();
    }
  } catch (err) {
    await abort();
    throw err;
  }
  return {
    async commit() {
      try {
        await fs.rename(temp, file);
      } catch (err) {
        await abort();
        throw err;
      }
      await syncDir(path.dirname(file));
    },
    abort,
  };
}

/** Writes all of `source` to `handle`; cancelling `signal` destroys `source` with the signal's reason. */
async function writeStream(handle: fs.FileHandle, source: Readable, signal: AbortSignal | undefined): Promise<void> {
  const onAbort = () => source.destroy(signal?.reason instanceof Error ? signal.reason : new Error('write cancelled'));
  signal?.throwIfAborted();
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    for await (const chunk of source) await writeAll(handle, chunk as Buffer);
  } finally {
    signal?.removeEventListener('abort', onAbort);
  }
}

/**
 * Writes all of `chunk` at `position` in the file, or at the handle's position without one (one write(2)
 * may take only part of it); returns its length.
 */
export async function writeAll(handle: fs.FileHandle, chunk: Buffer, position?: number): Promise<number> {
  for (let offset = 0; offset < chunk.length;) {
    const at = position === undefined ? null : position + offset;
    const { bytesWritten } = await handle.write(chunk, offset, chunk.length - offset, at);
    if (bytesWritten === 0) {
      throw Object.assign(new Error(`no space left to write ${chunk.length - offset} bytes`), { code: 'ENOSPC' });
    }
    offset += bytesWritten;
  }
  return chunk.length;
}

/** Creates `dir` and its missing parents so that they survive a crash (each new entry's parent is fsynced). */
export async function makeDirDurable(dir: string): Promise<void> {
  const first = await fs.mkdir(dir, { recursive: true });
  if (first === undefined) return;
  for (let created = path.resolve(dir); ; created = path.dirname(created)) {
    await syncDir(path.dirname(created));
    if (created === path.resolve(first)) return;
  }
}

/** Removes the temp files that writers of `file` killed mid-write left beside it. */
export async function removeStaleTemps(file: string): Promise<void> {
  const prefix = `${path.basename(file)}${TEMP_MARK}`;
  let names: string[];
  try {
    names = await fs.readdir(path.dirname(file));
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return;
    throw err;
  }
  for (const name of names) {
    if (name.startsWith(prefix)) await fs.rm(path.join(path.dirname(file), name), { force: true });
  }
}

/** Whether `name` is a temp file of {@link writeFileAtomic}. */
export function isTempFile(name: string): boolean {
  return name.includes(TEMP_MARK);
}

async function syncDir(dir: string): Promise<void> {
  const handle = await fs.open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** True when `err` is a Node system error with `code`. */
export function hasErrorCode(err: unknown, code: string): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}
