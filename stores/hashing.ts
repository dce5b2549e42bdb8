import { createHash, type Hash } from 'node:crypto';
import { Transform, type TransformCallback } from 'node:stream';
import { StasisError } from '../common/errors';
import type { Checkpoint } from '../common/schemas';

/** A pass-through that hashes (sha-256) and counts what flows through it, so a store hashes while it streams. */
export class HashingStream extends Transform {
  private readonly hash: Hash = createHash('sha256');
  bytes = 0;

  /** Given a checkpoint, a download of it: more bytes than its record declares fail the stream at once (not written whole first). */
  constructor(private readonly expected?: Checkpoint) {
    super();
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (this.expected && this.bytes + chunk.length > this.expected.bytes) {
      const { uri, bytes } = this.expected;
      callback(new StasisError('CHECKPOINT_INVALID', `checkpoint ${uri} is corrupt: more than its ${bytes} bytes`));
      return;
    }
    this.hash.update(chunk);
    this.bytes += chunk.length;
    callback(null, chunk);
  }

  /** The hex digest; call once, after the stream has ended. */
  digest(): string {
    return this.hash.digest('hex');
  }
}

/** Refuses a download whose bytes differ from what the checkpoint record says. */
export function verifyDownload(checkpoint: Checkpoint, sha256: string, bytes: number): void {
  if (sha256 !== checkpoint.sha256 || bytes !== checkpoint.bytes) {
    throw new StasisError(
      'CHECKPOINT_INVALID',
      `checkpoint ${checkpoint.uri} is corrupt: expected sha256 ${checkpoint.sha256} (${checkpoint.bytes} bytes), got ${sha256} (${bytes} bytes)`,
    );
  }
}
