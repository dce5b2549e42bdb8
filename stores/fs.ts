import { createHash } from 'node:crypto';
import { createReadStream, type Dirent } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { z } from 'zod';
import { StasisError } from '../common/errors';
import type { Checkpoint } from '../common/schemas';
import type { CheckpointStore, DownloadCheck, StoredObject } from './api';
import { abortReason } from './abort';
import { hasErrorCode, isTempFile, makeDirDurable, removeStaleTemps, writeFileAtomic } from './atomic-file';
import { downloadChecked, HashingStream } from './hashing';
import { checkKey, checkPrefix, checkPutBytes } from './keys';

// A checkpoint store in a local (or shared, e.g. NFS) directory: the embedded
// default when no S3 endpoint is configured. Each object is `<dir>/<key>` with
// its labels in a `<key>.labels.json` sidecar.

const Sidecar = z.object({ labels: z.record(z.string(), z.string()), sha256: z.string(), bytes: z.number() });

export class FsCheckpointStore implements CheckpointStore {
  readonly kind = 'fs' as const;
  private readonly dir: string;

  constructor(dir: string) {
    this.dir = path.resolve(dir);
  }

  async put(key: string, body: Readable, labels: Record<string, string>, signal?: AbortSignal): Promise<Checkpoint> {
    const file = path.join(this.dir, checkKey(key));
    // Piped at once: a body that fails while the directories are prepared fails the hasher, and with it the write.
    const hasher = new HashingStream();
    const feeding = pipeline(body, hasher);
    feeding.catch(() => undefined); // awaited below; the write fails with the same error first
    try {
      await makeDirDurable(path.dirname(file));
      await removeStaleTemps(file);
      await removeStaleTemps(sidecarOf(file));
      // Streamed into a temp file that is renamed only once whole: a failed or cancelled put leaves nothing under the key.
      await writeFileAtomic(file, hasher, signal ? { signal } : {});
      await feeding;
      const checkpoint: Checkpoint = { uri: pathToFileURL(file).href, sha256: hasher.digest(), bytes: hasher.bytes };
      await writeFileAtomic(
        sidecarOf(file),
        JSON.stringify({ labels, sha256: checkpoint.sha256, bytes: checkpoint.bytes }),
      );
      return checkpoint;
    } catch (err) {
      hasher.destroy();
      await fs.rm(file, { force: true });
      throw signal?.aborted ? abortReason(signal, 'checkpoint upload') : err;
    }
  }

  async putBytes(
    key: string,
    bytes: Buffer,
    labels: Record<string, string>,
    signal?: AbortSignal,
    given?: string,
  ): Promise<Checkpoint> {
    const file = path.join(this.dir, checkKey(key));
    checkPutBytes(key, bytes);
    const checkpoint: Checkpoint = {
      uri: pathToFileURL(file).href,
      sha256: createHash('sha256').update(bytes).digest('hex'),
      bytes: bytes.length,
    };
    // As S3 checks a signed payload's: a caller's hash that is not the bytes' fails the put.
    if (given !== undefined && given !== checkpoint.sha256)
      throw new Error(`putBytes ${key}: the bytes' sha-256 is not ${given}`);
    try {
      signal?.throwIfAborted();
      await makeDirDurable(path.dirname(file));
      await removeStaleTemps(file);
      await removeStaleTemps(sidecarOf(file));
      // As put: a temp file renamed only once whole and synced, so a failed write leaves nothing under the key.
      await writeFileAtomic(file, bytes);
      signal?.throwIfAborted();
      await writeFileAtomic(
        sidecarOf(file),
        JSON.stringify({ labels, sha256: checkpoint.sha256, bytes: checkpoint.bytes }),
      );
      signal?.throwIfAborted();
      return checkpoint;
    } catch (err) {
      // Nothing is removed: the key may name bytes an earlier checkpoint needs (see CheckpointStore.putBytes).
      throw signal?.aborted ? abortReason(signal, 'checkpoint upload') : err;
    }
  }

  async download(
    checkpoint: Checkpoint,
    file: string,
    signal?: AbortSignal,
    verify?: DownloadCheck,
  ): Promise<{ labels: Record<string, string> }> {
    const source = this.fileOf(checkpoint.uri);
    const sidecar = await this.readSidecar(source, checkpoint.uri);
    try {
      await downloadChecked(createReadStream(source), checkpoint, file, signal, verify);
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) throw notFound(checkpoint.uri);
      throw err;
    }
    return { labels: sidecar.labels };
  }

  uriOf(key: string): string {
    return pathToFileURL(path.join(this.dir, checkKey(key))).href;
  }

  async delete(uri: string): Promise<void> {
    const file = this.fileOf(uri);
    await fs.rm(file, { force: true });
    await fs.rm(sidecarOf(file), { force: true });
  }

  async deletePrefix(prefix: string): Promise<number> {
    const dir = path.join(this.dir, checkPrefix(prefix));
    let entries: Dirent[];
    try {
      entries = await fs.readdir(dir, { recursive: true, withFileTypes: true });
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return 0;
      throw err;
    }
    const deleted = entries.filter((e) => e.isFile() && !e.name.endsWith(SIDECAR) && !isTempFile(e.name)).length;
    await fs.rm(dir, { recursive: true, force: true });
    return deleted;
  }

  async read(uri: string, maxBytes: number): Promise<Buffer> {
    const file = this.fileOf(uri);
    try {
      if ((await fs.stat(file)).size > maxBytes) {
        throw new StasisError('CHECKPOINT_INVALID', `checkpoint object ${uri} is larger than ${maxBytes} bytes`);
      }
      return await fs.readFile(file);
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) throw notFound(uri);
      throw err;
    }
  }

  async list(prefix: string): Promise<StoredObject[]> {
    const dir = path.join(this.dir, checkPrefix(prefix));
    let entries: Dirent[];
    try {
      entries = await fs.readdir(dir, { recursive: true, withFileTypes: true });
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return [];
      throw err;
    }
    const objects: StoredObject[] = [];
    for (const entry of entries) {
      if (!entry.isFile() || entry.name.endsWith(SIDECAR) || isTempFile(entry.name)) continue;
      const file = path.join(entry.parentPath, entry.name);
      const stat = await fs.stat(file).catch((err: unknown) => {
        if (hasErrorCode(err, 'ENOENT')) return undefined; // deleted meanwhile
        throw err;
      });
      if (!stat) continue;
      const key = path.relative(this.dir, file).split(path.sep).join('/');
      objects.push({ key, uri: pathToFileURL(file).href, modified: stat.mtime });
    }
    return objects;
  }

  async exists(uri: string): Promise<boolean> {
    try {
      return (await fs.stat(this.fileOf(uri))).isFile();
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return false;
      throw err;
    }
  }

  /** The file a `file://` uri names; refuses uris outside this store's directory. */
  private fileOf(uri: string): string {
    let file: string;
    try {
      file = fileURLToPath(uri);
    } catch {
      throw new StasisError(
        'INVALID_ARGUMENT',
        `checkpoint uri ${JSON.stringify(uri)} is not a file:// uri of the fs store`,
      );
    }
    const relative = path.relative(this.dir, file);
    if (relative === '..' || relative.startsWith(`..${path.sep}`) || path.isAbsolute(relative)) {
      throw new StasisError('INVALID_ARGUMENT', `checkpoint uri ${uri} is outside the fs store ${this.dir}`);
    }
    checkKey(relative.split(path.sep).join('/'));
    return file;
  }

  private async readSidecar(file: string, uri: string): Promise<z.infer<typeof Sidecar>> {
    try {
      return Sidecar.parse(JSON.parse(await fs.readFile(sidecarOf(file), 'utf8')));
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) throw notFound(uri);
      throw new StasisError('CHECKPOINT_INVALID', `checkpoint ${uri} has an unreadable labels file: ${String(err)}`);
    }
  }
}

const SIDECAR = '.labels.json';
function sidecarOf(file: string): string {
  return `${file}${SIDECAR}`;
}

function notFound(uri: string): StasisError {
  return new StasisError('NOT_FOUND', `checkpoint ${uri} does not exist in the store`);
}

/**
 * Removes a partly written file once its stream has closed: an aborted stream may
 * still be opening its file, and removing it earlier would let the open re-create it.
 */
