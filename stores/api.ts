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
  /** Downloads into `file`, verifying the sha-256 and size recorded in `checkpoint`. */
  download(checkpoint: Checkpoint, file: string, signal?: AbortSignal): Promise<{ labels: Record<string, string> }>;
  delete(uri: string): Promise<void>;
  exists(uri: string): Promise<boolean>;
  /**
   * Deletes every checkpoint under `prefix` (`checkpoints/<name>/`, a sandbox's
   * checkpoints) and abandons the unfinished uploads the store can list there.
   * Returns how many objects it deleted.
   */
  deletePrefix(prefix: string): Promise<number>;
}
