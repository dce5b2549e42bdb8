import { StasisError } from '../common/errors';

/** Checkpoint keys are relative `/`-separated paths under `checkpoints/`, with no `..`, so they map safely onto files and S3 keys. */
export function checkKey(key: string): string {
  const parts = key.split('/');
  const valid =
    parts[0] === 'checkpoints' &&
    parts.length >= 2 &&
    parts.every((part) => part !== '' && part !== '.' && part !== '..' && /^[A-Za-z0-9._-]+$/.test(part));
  if (!valid) {
    throw new StasisError(
      'INVALID_ARGUMENT',
      `checkpoint key ${JSON.stringify(key)} must be "checkpoints/<name>/..." made of letters, digits, ".", "_" and "-"`,
    );
  }
  return key;
}

/** A prefix naming one directory of checkpoints: `checkpoints/<name>/`. */
export function checkPrefix(prefix: string): string {
  if (!prefix.endsWith('/')) {
    throw new StasisError('INVALID_ARGUMENT', `checkpoint prefix ${JSON.stringify(prefix)} must end with "/"`);
  }
  checkKey(prefix.slice(0, -1));
  return prefix;
}

/**
 * The largest object putBytes takes: one request, held in memory. Well above what the checkpoint
 * engine writes that way (a pack: ~12 MiB, and restore takes none stored larger than 24 MiB; a
 * segment: a few MiB; a top object: ~1 MiB at the default limit of 20 GiB a checkpoint).
 */
export const MAX_PUT_BYTES = 64 * 1024 * 1024;

/** Refuses what putBytes does not take in one request. */
export function checkPutBytes(key: string, bytes: Buffer): void {
  if (bytes.length > MAX_PUT_BYTES) {
    throw new StasisError(
      'INVALID_ARGUMENT',
      `object ${key} has ${bytes.length} bytes, more than the ${MAX_PUT_BYTES} a single put takes; stream it with put`,
    );
  }
}
