import { ApplicationFailure } from '@temporalio/common';
import { NON_RETRYABLE_CODES, StasisError } from '../common/errors';

/** Turns a StasisError into the ApplicationFailure type Temporal retries (or not) by code. */
export function toFailure(err: unknown): unknown {
  if (err instanceof StasisError) {
    return ApplicationFailure.create({
      type: err.code,
      message: err.message,
      nonRetryable: NON_RETRYABLE_CODES.includes(err.code),
    });
  }
  return err;
}

/**
 * A restore's failure: as toFailure, except that one that ran out of disk (ENOSPC, EDQUOT: the sandbox's
 * volume or the host's) fails for good, as UNAVAILABLE. Restores are retried with no attempt limit
 * (workflows/coordinator.ts, RESTORE_RETRY): retried, it would hold the resume, and the sandbox with it
 * (nothing else may change it meanwhile), for as long as the disk stays full. Failed, the resume leaves
 * the sandbox suspended, to be resumed again (DESIGN.md, Sandboxes).
 */
export function toRestoreFailure(err: unknown): unknown {
  const full = noSpace(err);
  if (!full) return toFailure(err);
  return ApplicationFailure.create({
    type: 'UNAVAILABLE',
    message: `no space left to restore the sandbox: ${full.message}`,
    nonRetryable: true,
  });
}

/**
 * The error in `err`'s causes that says the disk is full, if any. Not causeChain: it takes only errors
 * of this realm, and Node's own (fs) errors are of another under jest.
 */
function noSpace(err: unknown): { message: string } | undefined {
  const seen = new Set<unknown>();
  for (let e = err; typeof e === 'object' && e !== null && !seen.has(e); e = (e as { cause?: unknown }).cause) {
    seen.add(e);
    const { code, message } = e as { code?: unknown; message?: unknown };
    if (code === 'ENOSPC' || code === 'EDQUOT') return { message: String(message) };
  }
  return undefined;
}

/** Wraps every function of an activity object so provider errors cross as typed failures. */
export function withFailures<T extends Record<string, (...args: never[]) => Promise<unknown>>>(activities: T): T {
  const wrapped: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(activities)) {
    wrapped[name] = async (...args: never[]) => {
      try {
        return await fn(...args);
      } catch (err) {
        throw toFailure(err);
      }
    };
  }
  return wrapped as T;
}
