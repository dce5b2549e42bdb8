import { ActivityFailure, ApplicationFailure } from '@temporalio/workflow';
import { causeChain, type Rejection } from '../common/errors';

// How workflow code raises and reads failures: a refusal as the failure an Update
// validator throws, and what a Temporal failure chain says at its bottom.

/** A refusal as the non-retryable failure an Update validator (or handler) throws; its type is the code. */
export function refuse(rejection: Rejection): never {
  throw ApplicationFailure.create({ type: rejection.code, message: rejection.message, nonRetryable: true });
}

/**
 * A refusal for now: the failure an Update validator throws when the same call, sent again a little
 * later, will be taken. Marked retryable (the only refusal so), which is what the typed client's
 * retry of Updates looks for (client/updates.ts).
 */
export function refuseForNow(rejection: Rejection): never {
  throw ApplicationFailure.create({ type: rejection.code, message: rejection.message, nonRetryable: false });
}

/** The innermost message of a Temporal failure chain, after the activity it came from (a bare "Heartbeat timeout" names no culprit). */
export function failureMessage(err: unknown): string {
  let innermost: Error | undefined;
  let activity: string | undefined;
  for (const e of causeChain(err)) {
    if (e instanceof ActivityFailure) activity ??= e.activityType;
    innermost = e;
  }
  const message = innermost ? innermost.message : String(err);
  return activity ? `${activity}: ${message}` : message;
}

/** The ApplicationFailure type (our error code) at the bottom of a failure chain, if any. */
export function failureCode(err: unknown): string | undefined {
  let code: string | undefined;
  for (const e of causeChain(err)) {
    const type = (e as { type?: unknown }).type;
    if (typeof type === 'string') code = type;
  }
  return code;
}
