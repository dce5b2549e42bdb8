import { QueryRejectedError, WorkflowFailedError, WorkflowUpdateFailedError } from '@temporalio/client';
import { ApplicationFailure, WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/common';
import { isErrorCode, StasisError } from '../common/errors';

// Maps what Temporal answers into the one StasisError class with code and httpStatus.

function applicationFailureOf(err: unknown): ApplicationFailure | undefined {
  let e: unknown = err;
  while (e instanceof Error) {
    if (e instanceof ApplicationFailure) return e;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** True when Temporal refuses an update because the workflow has already closed. */
export function isClosedWorkflow(err: unknown): boolean {
  return err instanceof Error && !(err instanceof WorkflowUpdateFailedError) && /already completed/i.test(err.message);
}

export function toStasisError(err: unknown, what: string): StasisError {
  if (err instanceof StasisError) return err;
  if (err instanceof WorkflowNotFoundError) return new StasisError('NOT_FOUND', `${what} not found`);
  if (err instanceof WorkflowExecutionAlreadyStartedError) return new StasisError('ALREADY_EXISTS', `${what} already exists`);
  const failure = applicationFailureOf(err);
  if (failure) {
    const code = failure.type;
    return new StasisError(isErrorCode(code) ? code : 'INTERNAL', failure.message);
  }
  if (err instanceof WorkflowUpdateFailedError || err instanceof WorkflowFailedError || err instanceof QueryRejectedError) {
    return new StasisError('INTERNAL', `${what}: ${err.message}`);
  }
  const grpc = (err as { code?: unknown }).code;
  if (grpc === 5) return new StasisError('NOT_FOUND', `${what} not found`);
  if (grpc === 14 || grpc === 4) return new StasisError('UNAVAILABLE', `Temporal is unavailable: ${(err as Error).message}`);
  return new StasisError('INTERNAL', `${what}: ${err instanceof Error ? err.message : String(err)}`);
}
