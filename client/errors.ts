import {
  QueryNotRegisteredError,
  QueryRejectedError,
  WorkflowFailedError,
  WorkflowUpdateFailedError,
} from '@temporalio/client';
import {
  ApplicationFailure,
  CancelledFailure,
  WorkflowExecutionAlreadyStartedError,
  WorkflowNotFoundError,
} from '@temporalio/common';
import { END_REASON, findCause, GRPC_STATUS, isErrorCode, StasisError, toInternal } from '../common/errors';
import type { RunSnapshot } from '../common/schemas';
import { isTerminal as isTerminalStatus } from '../workflows/run-state';

// Maps what Temporal answers into the one StasisError class with code and httpStatus.

/**
 * An Update refused because the Run's workflow has closed or is closing, said in
 * the contract's terms from the Run's snapshot (when the Run exists).
 */
export function refusedByClosedRun(
  runId: string,
  err: unknown,
  snapshot: Pick<RunSnapshot, 'status' | 'error'> | undefined,
): StasisError {
  if (!isClosedWorkflow(err) || !snapshot || !isTerminalStatus(snapshot.status))
    return toStasisError(err, `run ${runId}`);
  if (snapshot.status === 'EXPIRED' && snapshot.error?.code === END_REASON.SUSPEND_EXPIRED) {
    return new StasisError('STALE_SANDBOX_ROUTE', `run ${runId} was suspended past retention`);
  }
  return new StasisError('INVALID_STATE_TRANSITION', `run ${runId} is ${snapshot.status}`);
}

/**
 * True when Temporal refuses an update because the workflow has closed: "already
 * completed", or (a gRPC NOT_FOUND) "workflow update was aborted by closing workflow"
 * when it closed while the Update was in flight, e.g. an answer racing a Run's expiry.
 */
export function isClosedWorkflow(err: unknown): boolean {
  return (
    err instanceof Error &&
    !(err instanceof WorkflowUpdateFailedError) &&
    /already completed|aborted by closing workflow/i.test(err.message)
  );
}

export function toStasisError(err: unknown, what: string): StasisError {
  if (err instanceof StasisError) return err;
  if (err instanceof WorkflowNotFoundError) return new StasisError('NOT_FOUND', `${what} not found`);
  if (err instanceof WorkflowExecutionAlreadyStartedError)
    return new StasisError('ALREADY_EXISTS', `${what} already exists`);
  // Before the handler test: the SDK raises an answer Temporal refuses as too large as QueryNotRegisteredError too.
  if (isAnswerTooLarge(err))
    return new StasisError(
      'INTERNAL',
      `${what} could not be read: its answer is larger than Temporal passes (${err.message})`,
    );
  if (isUnregisteredHandler(err)) return new StasisError('NOT_FOUND', `${what} not found`);
  const failure = findCause(err, (e) => e instanceof ApplicationFailure);
  if (failure) {
    const code = failure.type;
    return new StasisError(isErrorCode(code) ? code : 'INTERNAL', failure.message);
  }
  // An Update whose handler was waiting when the workflow was cancelled (a suspend or resume racing a
  // cancel): the Run is ending, which is no server error.
  if (err instanceof WorkflowUpdateFailedError && findCause(err, (e) => e instanceof CancelledFailure))
    return new StasisError('INVALID_STATE_TRANSITION', `${what} was cancelled while it took this request`);
  if (
    err instanceof WorkflowUpdateFailedError ||
    err instanceof WorkflowFailedError ||
    err instanceof QueryRejectedError
  ) {
    return toInternal(err, what);
  }
  const grpc = grpcErrorOf(err);
  if (grpc?.code === GRPC_STATUS.NOT_FOUND) return new StasisError('NOT_FOUND', `${what} not found`);
  if (grpc && isTransientGrpc(grpc.code))
    return new StasisError('UNAVAILABLE', `Temporal is unavailable: ${grpc.message}`);
  // A query no worker took: Temporal says so when none has polled the task queue lately (else it times out).
  if (grpc?.code === GRPC_STATUS.FAILED_PRECONDITION && NO_POLLER.test(grpc.message))
    return new StasisError('UNAVAILABLE', `no worker answers for ${what}: ${grpc.message}`);
  if (grpc?.code === GRPC_STATUS.FAILED_PRECONDITION && TASK_FAILING.test(grpc.message))
    return new StasisError(
      'INTERNAL',
      `${what}: its workflow task failed while taking this request, which was not applied ` +
        `(Temporal: ${grpc.message}); the worker's log says why`,
    );
  // The client's words alone ("Workflow Update failed") say nothing: the server's go with them.
  if (grpc && err instanceof Error && !err.message.includes(grpc.message))
    return new StasisError('INTERNAL', `${what}: ${err.message} (${grpc.message})`);
  return toInternal(err, what);
}

/**
 * Temporal's answer to an Update that reached a workflow whose task failed with it (and fails again on
 * each retry), e.g. a completion past gRPC's 4 MiB message limit: the client raises it as a bare
 * "Workflow Update failed".
 */
export const TASK_FAILING = /workflow task in failed state/i;

/** Temporal's FAILED_PRECONDITION for a query to a task queue no worker has polled lately. */
const NO_POLLER = /no poller seen for task queue recently/i;

/**
 * The gRPC status error in a failure chain: the client wraps it (a ServiceError
 * "Failed to query Workflow" whose cause is the UNAVAILABLE status), so look past the top.
 */
export function grpcErrorOf(err: unknown): { code: number; message: string } | undefined {
  const e = findCause(err, (c): c is Error & { code: number } => typeof (c as { code?: unknown }).code === 'number');
  return e && { code: e.code, message: e.message };
}

/** A gRPC status a retry may get past: the server unreachable (UNAVAILABLE) or too slow (DEADLINE_EXCEEDED). */
export function isTransientGrpc(code: number): boolean {
  return code === GRPC_STATUS.UNAVAILABLE || code === GRPC_STATUS.DEADLINE_EXCEEDED;
}

/** Temporal's words for a payload past its limit (about 2 MB), e.g. a query's answer: "Blob data size exceeds limit". */
const BLOB_TOO_LARGE = /blob data size exceeds limit/i;

/**
 * True when Temporal refused a query's answer as larger than it passes. The SDK raises every query
 * failure the server returns as INVALID_ARGUMENT as a QueryNotRegisteredError, this one included: it is
 * no missing handler (the Run exists and answers), so it must not read as NOT_FOUND.
 */
export function isAnswerTooLarge(err: unknown): err is Error {
  return err instanceof QueryNotRegisteredError && BLOB_TOO_LARGE.test(err.message);
}

/**
 * True when the workflow has no handler for the query or Update sent: the id names a
 * workflow of another kind (a sandbox's, asked as a Run), so what was asked for is not there.
 */
export function isUnregisteredHandler(err: unknown): boolean {
  if (err instanceof QueryNotRegisteredError) return !isAnswerTooLarge(err);
  // The SDK rejects an Update it has no handler for with a bare failure saying so (no type to match).
  return (
    findCause(err, (e) => e instanceof ApplicationFailure && /^No registered handler for update\b/.test(e.message)) !==
    undefined
  );
}
