import type { Readable } from 'node:stream';
import type { Checkpoint } from '../common/schemas';

/**
 * Where workspace checkpoints live: `s3` (any S3-compatible store) or `fs`.
 * Keys are under `checkpoints/`. Labels (run/spec/policy hashes) are kept beside
 * the bytes and handed back on download.
 */
export interface CheckpointStore {
  readonly kind: 's3' | 'fs';
  /** Streams `body` into the store under `key`; returns its uri, sha-256 and size. */
  put(key: string, body: Readable, labels: Record<string, string>, signal?: AbortSignal): Promise<Checkpoint>;
  /**
   * Stores `bytes` (at most MAX_PUT_BYTES of stores/keys.ts, else INVALID_ARGUMENT) under `key` in one request; returns
   * its uri, sha-256 and size. For the objects already in memory (checkpoint packs, manifest segments
   * and top objects). One request (a rename on fs), so the key holds what it held before or the whole
   * of `bytes`, never a part. A failed or cancelled call never removes what is under the key: a pack or
   * segment is named by its content, so the same name may be one an earlier checkpoint needs; one a
   * failed call stored anyway is whole, and GC collects it when no manifest names it. `sha256`, the
   * caller's sha-256 (hex) of `bytes` if it has one, spares the store hashing them again where the
   * store itself checks it against the bytes it receives (S3's signed payload): a wrong one fails the put.
   */
  putBytes(
    key: string,
    bytes: Buffer,
    labels: Record<string, string>,
    signal?: AbortSignal,
    sha256?: string,
  ): Promise<Checkpoint>;
  /**
   * Downloads into `file`, verifying the size recorded in `checkpoint` and, unless `verify` is
   * 'size', its sha-256. 'size' is for an object whose reader checks every byte it uses against
   * hashes of its own (a pack: restore hashes each chunk it takes from it).
   */
  download(
    checkpoint: Checkpoint,
    file: string,
    signal?: AbortSignal,
    verify?: DownloadCheck,
  ): Promise<{ labels: Record<string, string> }>;
  delete(uri: string): Promise<void>;
  /** The uri an object stored under `key` has (what put and putBytes return as `uri`). */
  uriOf(key: string): string;
  exists(uri: string): Promise<boolean>;
  /**
   * Deletes every checkpoint under `prefix` (`checkpoints/<name>/`, a sandbox's
   * checkpoints) and abandons the unfinished uploads the store can list there.
   * Returns how many objects it deleted.
   */
  deletePrefix(prefix: string): Promise<number>;
  /**
   * The bytes of a small object (a manifest) whose hash is not known beforehand,
   * at most `maxBytes`; NOT_FOUND if there is none. The caller checks what it reads.
   */
  read(uri: string, maxBytes: number, signal?: AbortSignal): Promise<Buffer>;
  /** The objects under `prefix` (`checkpoints/<name>/`), each with its uri and when it was written. */
  list(prefix: string): Promise<StoredObject[]>;
}

/** What a download checks against the record it is given: its sha-256 and size, or its size only. */
export type DownloadCheck = 'sha256' | 'size';

export interface StoredObject {
  /** The key, as given to put. */
  key: string;
  uri: string;
  modified: Date;
}
