import { QueryRejectedError, WorkflowFailedError, WorkflowUpdateFailedError } from '@temporalio/client';
import { ApplicationFailure, WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/common';
import { isErrorCode, StasisError } from '../common/errors';
import type { RunSnapshot } from '../common/schemas';
import { isTerminal as isTerminalStatus } from '../workflows/run-state';

// Maps what Temporal answers into the one StasisError class with code and httpStatus.

function applicationFailureOf(err: unknown): ApplicationFailure | undefined {
  let e: unknown = err;
  while (e instanceof Error) {
    if (e instanceof ApplicationFailure) return e;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

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
  if (snapshot.status === 'EXPIRED' && snapshot.error?.code === 'SUSPEND_EXPIRED') {
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
  const failure = applicationFailureOf(err);
  if (failure) {
    const code = failure.type;
    return new StasisError(isErrorCode(code) ? code : 'INTERNAL', failure.message);
  }
  if (
    err instanceof WorkflowUpdateFailedError ||
    err instanceof WorkflowFailedError ||
    err instanceof QueryRejectedError
  ) {
    return new StasisError('INTERNAL', `${what}: ${err.message}`);
  }
  const grpc = grpcErrorOf(err);
  if (grpc?.code === 5) return new StasisError('NOT_FOUND', `${what} not found`);
  if (grpc?.code === 14 || grpc?.code === 4)
    return new StasisError('UNAVAILABLE', `Temporal is unavailable: ${grpc.message}`);
  return new StasisError('INTERNAL', `${what}: ${err instanceof Error ? err.message : String(err)}`);
}

/**
 * The gRPC status error in a failure chain: the client wraps it (a ServiceError
 * "Failed to query Workflow" whose cause is the UNAVAILABLE status), so look past the top.
 */
export function grpcErrorOf(err: unknown): { code: number; message: string } | undefined {
  let e: unknown = err;
  while (e instanceof Error) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'number') return { code, message: e.message };
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}
