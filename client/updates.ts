import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import { findCause, GRPC_STATUS } from '../common/errors';
import { grpcErrorOf, isTransientGrpc, TASK_FAILING } from './errors';

// Updates sent again while Temporal is unavailable or too slow to answer (under
// load the server's own deadline passes: DEADLINE_EXCEEDED). Every attempt
// carries the same update id, and Temporal deduplicates Updates by id, so an
// Update that did arrive is never applied twice: the retry gets its outcome.
// Also sent again: an Update its workflow refused for now (a sandbox whose
// history keeps no room for it, workflows/lifecycle.ts decideHistoryRoom). A refused Update is not
// recorded, so its id is free for the retry, which the next run then takes.

/** How long an Update is retried before its error reaches the caller. */
const RETRY_BUDGET_MS = 60_000;

export async function sendUpdate<T>(
  send: (updateId: string) => Promise<T>,
  updateId: string = randomUUID(),
): Promise<T> {
  const deadline = Date.now() + RETRY_BUDGET_MS;
  for (let delayMs = 500; ; delayMs = Math.min(delayMs * 2, 5_000)) {
    try {
      return await send(updateId);
    } catch (err) {
      if (!isTransient(err) || Date.now() + delayMs > deadline) throw err;
      // Spread: Updates sent together and failed together must not all come back in one workflow task.
      await sleep(delayMs * (0.5 + Math.random()));
    }
  }
}

/**
 * The server's answer for an Update it had handed to the worker when that workflow task failed on
 * completion (its WorkflowNotReady, FAILED_PRECONDITION): the Update was never accepted, and the server
 * leaves the retry to the caller. Seen when an answer reached a Run whose task was ending it (expiry):
 * the server refused that task's completion for the new message, and the answer came back as this.
 */
const TASK_FAILED_UNDER_UPDATE = /unexpected workflow task failure/i;
// And its answer while that task fails again (TASK_FAILING): the Update was not applied either. Updates
// sent together (four writes of 1 MiB) came back in one task, whose completion carries each request
// back and passed gRPC's 4 MB: sent again apart, each is taken.

/**
 * An Update the workflow refused for now (workflows/failures.ts refuseForNow): its own failure, right
 * under the Update's, is UNAVAILABLE and retryable. A failure from deeper down (an activity's) or one
 * marked non-retryable (a resume that found its host gone) is the Update's outcome, never retried:
 * Temporal would only answer the same outcome for the same id.
 */
export function isRefusedForNow(err: unknown): boolean {
  if (!(err instanceof WorkflowUpdateFailedError)) return false;
  const failure = err.cause;
  return failure instanceof ApplicationFailure && failure.type === 'UNAVAILABLE' && !failure.nonRetryable;
}

/**
 * DEADLINE_EXCEEDED or UNAVAILABLE in the chain, the SDK's own Update RPC timeout, an Update its task
 * failed under, or one its workflow refused for now.
 */
function isTransient(err: unknown): boolean {
  if (isRefusedForNow(err)) return true;
  if (findCause(err, (e) => e instanceof WorkflowUpdateRPCTimeoutOrCancelledError)) return true;
  const grpc = grpcErrorOf(err);
  if (grpc === undefined) return false;
  return (
    isTransientGrpc(grpc.code) ||
    (grpc.code === GRPC_STATUS.FAILED_PRECONDITION &&
      (TASK_FAILED_UNDER_UPDATE.test(grpc.message) || TASK_FAILING.test(grpc.message)))
  );
}
