import { readFileSync } from 'node:fs';
import { StasisError } from '../common/errors';
import { hasErrorCode } from './atomic-file';

// File leases (fcntl F_SETLEASE) a sandbox process holds on its own files. While one stands, any other
// open of the file blocks, or with O_NONBLOCK fails with EAGAIN; the open also asks the kernel to break
// the lease, which it does within /proc/sys/fs/lease-break-time (45 s by default) whatever the holder
// does, and a frozen holder cannot take it again. The worker opens sandbox files with O_NONBLOCK only,
// so a lease never holds one of its threads: a checkpoint waits the break out (LeaseWaits, walk.ts), a
// file read is refused (leasedError).

/** Whether an open failed because a lease stands on the file. */
export function isLeased(err: unknown): boolean {
  return hasErrorCode(err, 'EAGAIN') || hasErrorCode(err, 'EWOULDBLOCK');
}

/**
 * A file refused while a sandbox process holds a lease on it (retryable): a file read at once, a
 * checkpoint's read once it `waited` the kernel's break time out in vain.
 */
export function leasedError(file: string, waited = false): StasisError {
  return new StasisError(
    'UNAVAILABLE',
    `${file} is leased by a sandbox process (fcntl F_SETLEASE)${
      waited
        ? ', and the lease was not broken in time'
        : ': try again once it lets go, or once the kernel breaks the lease'
    }`,
  );
}

/** The kernel's time for a lease holder to let go (lease-break-time), capped at MAX_BREAK_MS. */
export function leaseBreakMs(): number {
  try {
    const seconds = Number(readFileSync('/proc/sys/fs/lease-break-time', 'utf8').trim());
    if (Number.isFinite(seconds) && seconds >= 0) return Math.min(seconds * 1000, MAX_BREAK_MS);
  } catch {
    // not Linux's procfs: its default
  }
  return 45_000;
}

/** Longer than any checkpoint should wait: an operator who set a longer break time gets UNAVAILABLE after it. */
const MAX_BREAK_MS = 5 * 60_000;
