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
