import { createHash, type Hash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { StasisError } from '../common/errors';
import type { Checkpoint } from '../common/schemas';
import type { DownloadCheck } from './api';

/**
 * A pass-through that hashes (sha-256) and counts what flows through it, so a store hashes while it
 * streams; with `verify` 'size', it only counts.
 */
export class HashingStream extends Transform {
  private readonly hash: Hash | undefined;
  bytes = 0;

  /** Given a checkpoint, a download of it: more bytes than its record declares fail the stream at once (not written whole first). */
  constructor(
    private readonly expected?: Checkpoint,
    verify: DownloadCheck = 'sha256',
  ) {
    super();
    this.hash = verify === 'sha256' ? createHash('sha256') : undefined;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (this.expected && this.bytes + chunk.length > this.expected.bytes) {
      const { uri, bytes } = this.expected;
      callback(new StasisError('CHECKPOINT_INVALID', `checkpoint ${uri} is corrupt: more than its ${bytes} bytes`));
      return;
    }
    this.hash?.update(chunk);
    this.bytes += chunk.length;
    callback(null, chunk);
  }

  /** The hex digest; call once, after the stream has ended. */
  digest(): string {
    if (!this.hash) throw new Error('a stream that only counts has no digest');
    return this.hash.digest('hex');
  }

  /** Refuses what streamed through if it differs from the checkpoint it was given (see verifyDownload). */
  check(): void {
    const { expected } = this;
    if (!expected) throw new Error('no checkpoint to check the download against');
    if (this.hash) verifyDownload(expected, this.digest(), this.bytes);
    else if (this.bytes !== expected.bytes) {
      throw new StasisError(
        'CHECKPOINT_INVALID',
        `checkpoint ${expected.uri} is corrupt: expected ${expected.bytes} bytes, got ${this.bytes}`,
      );
    }
  }
}

/** Refuses a download whose bytes differ from what the checkpoint record says. */
function verifyDownload(checkpoint: Checkpoint, sha256: string, bytes: number): void {
  if (sha256 !== checkpoint.sha256 || bytes !== checkpoint.bytes) {
    throw new StasisError(
      'CHECKPOINT_INVALID',
      `checkpoint ${checkpoint.uri} is corrupt: expected sha256 ${checkpoint.sha256} (${checkpoint.bytes} bytes), got ${sha256} (${bytes} bytes)`,
    );
  }
}

/**
 * Streams a checkpoint's bytes into `file` (mode 0600) and checks them against its record. On any failure
 * no file is left: it is removed only once the write stream has closed, since a stream destroyed early
 * may still open (create) the file after a removal done at once.
 */
export async function downloadChecked(
  source: Readable,
  checkpoint: Checkpoint,
  file: string,
  signal?: AbortSignal,
  verify?: DownloadCheck,
): Promise<void> {
  const hasher = new HashingStream(checkpoint, verify);
  const out = createWriteStream(file, { mode: 0o600 });
  try {
    await pipeline(source, hasher, out, signal ? { signal } : {});
    hasher.check();
  } catch (err) {
    if (!out.closed) await new Promise<void>((resolve) => out.once('close', () => resolve()));
    await fs.rm(file, { force: true });
    throw err;
  }
}
