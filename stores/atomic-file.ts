import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';

/**
 * Writes `file` so that readers see the old content or the new one, never a
 * torn write: a temp file beside it, fsync, then rename.
 */
export async function writeFileAtomic(file: string, data: string | Buffer): Promise<void> {
  const temp = `${file}.tmp-${randomBytes(6).toString('hex')}`;
  const handle = await fs.open(temp, 'w', 0o600);
  try {
    await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
  }
  try {
    await fs.rename(temp, file);
  } catch (err) {
    await fs.rm(temp, { force: true });
    throw err;
  }
}

/** True when `err` is a Node system error with `code`. */
export function hasErrorCode(err: unknown, code: string): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}
