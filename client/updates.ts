import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { WorkflowUpdateRPCTimeoutOrCancelledError } from '@temporalio/client';
import { findCause } from '../common/errors';
import { grpcErrorOf, isTransientGrpc } from './errors';

// Updates sent again while Temporal is unavailable or too slow to answer (under
// load the server's own deadline passes: DEADLINE_EXCEEDED). Every attempt
// carries the same update id, and Temporal deduplicates Updates by id, so an
// Update that did arrive is never applied twice: the retry gets its outcome.

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
      await sleep(delayMs);
    }
  }
}

/** DEADLINE_EXCEEDED or UNAVAILABLE in the chain, or the SDK's own Update RPC timeout. */
function isTransient(err: unknown): boolean {
  if (findCause(err, (e) => e instanceof WorkflowUpdateRPCTimeoutOrCancelledError)) return true;
  const code = grpcErrorOf(err)?.code;
  return code !== undefined && isTransientGrpc(code);
}
