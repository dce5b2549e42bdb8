import { QueryNotRegisteredError, ServiceError, WorkflowUpdateFailedError } from '@temporalio/client';
import { ApplicationFailure, WorkflowNotFoundError } from '@temporalio/common';
import { refusedByClosedRun, toStasisError } from '../../client/errors';

// How the typed client names what Temporal answered (found by the fault suite:
// with the server down, list and get said INTERNAL instead of UNAVAILABLE).

const grpc = (code: number, message: string) => Object.assign(new Error(message), { code });

describe('toStasisError', () => {
  test.each([
    ['a bare gRPC UNAVAILABLE', grpc(14, '14 UNAVAILABLE: connect ECONNREFUSED'), 'UNAVAILABLE', 503],
    [
      'UNAVAILABLE inside a ServiceError (list, query)',
      new ServiceError('Failed to list workflows', { cause: grpc(14, '14 UNAVAILABLE: No connection established') }),
      'UNAVAILABLE',
      503,
    ],
    [
      'DEADLINE_EXCEEDED inside a ServiceError',
      new ServiceError('Failed to query Workflow', { cause: grpc(4, '4 DEADLINE_EXCEEDED') }),
      'UNAVAILABLE',
      503,
    ],
    [
      'NOT_FOUND inside a ServiceError',
      new ServiceError('Failed to query Workflow', { cause: grpc(5, '5 NOT_FOUND: workflow not found') }),
      'NOT_FOUND',
      404,
    ],
    [
      'an update refused by its validator',
      new WorkflowUpdateFailedError(
        'failed',
        ApplicationFailure.create({ type: 'INVALID_ARGUMENT', message: 'stop: takes no arguments, got 1' }),
      ),
      'INVALID_ARGUMENT',
      400,
    ],
    [
      'a query no worker took (FAILED_PRECONDITION "no poller seen"): the workers are down',
      new ServiceError('Failed to query Workflow', {
        cause: grpc(9, '9 FAILED_PRECONDITION: no poller seen for task queue recently, worker may be down'),
      }),
      'UNAVAILABLE',
      503,
    ],
    ['another FAILED_PRECONDITION', grpc(9, '9 FAILED_PRECONDITION: something else'), 'INTERNAL', 500],
    [
      'a query answer Temporal refused as too large (the SDK raises it as QueryNotRegisteredError): the Run exists',
      new QueryNotRegisteredError('Blob data size exceeds limit.', 3),
      'INTERNAL',
      500,
    ],
    [
      'a query the workflow has no handler for: a workflow of another kind',
      new QueryNotRegisteredError('Workflow did not register a handler for snapshot. Registered queries: []', 3),
      'NOT_FOUND',
      404,
    ],
    ['anything else', new Error('boom'), 'INTERNAL', 500],
  ])('%s', (_what, err, code, httpStatus) => {
    expect(toStasisError(err, 'run r1')).toMatchObject({ code, httpStatus });
  });

  test('an unavailable server is named with the cause, not the wrapper', () => {
    const wrapped = new ServiceError('Failed to list workflows', {
      cause: grpc(14, '14 UNAVAILABLE: No connection established'),
    });
    expect(toStasisError(wrapped, 'runs').message).toBe(
      'Temporal is unavailable: 14 UNAVAILABLE: No connection established',
    );
  });
});

// An ask whose workflow task passed gRPC's 4 MiB limit (the memo, the Update's input and a webhook
// delivery's, found by an attack review): the task failed on each try and the agent got a bare 500
// "Workflow Update failed" (what the SDK raises, a ServiceError over Temporal's FAILED_PRECONDITION).
describe('an Update its workflow task failed under', () => {
  const taskFailing = new ServiceError('Workflow Update failed', {
    cause: grpc(
      9,
      '9 FAILED_PRECONDITION: Unable to perform workflow execution update due to Workflow Task in failed state.',
    ),
  });

  test("names the Run, that the request was not applied, and Temporal's words", () => {
    const failure = toStasisError(taskFailing, 'run r1');
    expect(failure).toMatchObject({ code: 'INTERNAL', httpStatus: 500 });
    expect(failure.message).toMatch(
      /^run r1: its workflow task failed while taking this request, which was not applied/,
    );
    expect(failure.message).toContain('Workflow Task in failed state');
    expect(failure.message).not.toBe('run r1: Workflow Update failed');
  });

  test("another failure under the client's wrapper keeps the server's words", () => {
    const other = new ServiceError('Workflow Update failed', {
      cause: grpc(9, '9 FAILED_PRECONDITION: something else'),
    });
    expect(toStasisError(other, 'run r1').message).toBe(
      'run r1: Workflow Update failed (9 FAILED_PRECONDITION: something else)',
    );
  });
});

describe('refusedByClosedRun', () => {
  // An answer sent as the Run expired, its workflow closing meanwhile (seen in CI): the server's
  // AbortedByWorkflowClosingErr is a gRPC NOT_FOUND, which the SDK raises as WorkflowNotFoundError.
  const closedNotFound = new WorkflowNotFoundError('workflow execution already completed', 'r1', undefined);
  const updateNotFound = new WorkflowNotFoundError('workflow update was aborted by closing workflow', 'r1', undefined);
  const alreadyCompleted = new Error('workflow execution already completed');
  const expired = {
    status: 'EXPIRED' as const,
    error: { code: 'SUSPEND_EXPIRED', message: 'suspended longer than the retention period' },
  };

  test.each([
    ['"already completed" for a Run expired past retention', alreadyCompleted, expired, 'STALE_SANDBOX_ROUTE', 409],
    ['aborted by the closing workflow of an expired Run', updateNotFound, expired, 'STALE_SANDBOX_ROUTE', 409],
    [
      'NOT_FOUND "already completed" for a completed Run',
      closedNotFound,
      { status: 'COMPLETED' as const },
      'INVALID_STATE_TRANSITION',
      409,
    ],
    ['NOT_FOUND for a Run with no snapshot (it does not exist)', updateNotFound, undefined, 'NOT_FOUND', 404],
    ['NOT_FOUND for a Run still running', updateNotFound, { status: 'WAITING' as const }, 'NOT_FOUND', 404],
    [
      'a validator refusal is passed through',
      new WorkflowUpdateFailedError(
        'failed',
        ApplicationFailure.create({ type: 'ALREADY_ANSWERED', message: 'answered' }),
      ),
      expired,
      'ALREADY_ANSWERED',
      409,
    ],
  ])('%s', (_what, err, snapshot, code, httpStatus) => {
    expect(refusedByClosedRun('r1', err, snapshot)).toMatchObject({ code, httpStatus });
  });
});
