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
