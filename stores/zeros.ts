// Restores keep a file's holes: a block of the file that is all zeros is not
// written, only skipped (it reads back as zeros), and the file is given its
// length at the end. A sparse file a sandbox made (`truncate -s 200M big`, or a
// byte every few MiB) would otherwise take its whole size on the restoring disk:
// more than the sandbox's volume, or up to a checkpoint's limit of the host's
// disk, having used almost none. Looked at block by block, not chunk by chunk: a
// chunk holding one byte of data and MiBs of zeros is written as that one block.

import type { FileHandle } from 'node:fs/promises';
import { writeAll } from './atomic-file';

/** The filesystem block a hole is made of (ext4's, the page size): a zero block of the file is left out. */
export const HOLE_BLOCK = 4096;

const ZEROS = Buffer.alloc(HOLE_BLOCK);

/**
 * The runs of `bytes` to write, as [start, end) offsets in it, when `bytes` go at `position` in a file:
 * all of it but its pieces between the file's block boundaries that are all zeros. Ordinary data costs
 * a look at one byte per block (the first of a piece of text or code is not zero) and is one run.
 */
export function dataRuns(bytes: Buffer, position: number): [number, number][] {
  const runs: [number, number][] = [];
  let start = -1;
  for (let at = 0; at < bytes.length;) {
    const next = Math.min(bytes.length, at + HOLE_BLOCK - ((position + at) % HOLE_BLOCK));
    if (!isZeros(bytes, at, next)) {
      if (start < 0) start = at;
    } else if (start >= 0) {
      runs.push([start, at]);
      start = -1;
    }
    at = next;
  }
  if (start >= 0) runs.push([start, bytes.length]);
  return runs;
}

/** Whether bytes[start, end) (at most a block) are all zeros: its first and last bytes first, then memcmp. */
function isZeros(bytes: Buffer, start: number, end: number): boolean {
  if (bytes[start] !== 0 || bytes[end - 1] !== 0) return false;
  return ZEROS.compare(bytes, start, end, 0, end - start) === 0;
}

/**
 * Writes `bytes` at `position` in the file but for their blocks of zeros (left holes); resolves to the
 * end of the last bytes written, or `position` when all were zeros. A file whose last write ends before
 * its length is given its length with truncate.
 */
export async function writeKeepingHoles(handle: FileHandle, bytes: Buffer, position: number): Promise<number> {
  let end = position;
  for (const [start, stop] of dataRuns(bytes, position)) {
    await writeAll(handle, bytes.subarray(start, stop), position + start);
    end = position + stop;
  }
  return end;
}
