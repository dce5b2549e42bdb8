import { ServiceError, WorkflowUpdateFailedError } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import { toStasisError } from '../../client/errors';

// How the typed client names what Temporal answered (found by the fault suite:
// with the server down, list and get said INTERNAL instead of UNAVAILABLE).

const grpc = (code: number, message: string) => Object.assign(new Error(message), { code });

describe('toStasisError', () => {
  test.each([
    ['a bare gRPC UNAVAILABLE', grpc(14, '14 UNAVAILABLE: connect ECONNREFUSED'), 'UNAVAILABLE', 503],
    ['UNAVAILABLE inside a ServiceError (list, query)', new ServiceError('Failed to list workflows', { cause: grpc(14, '14 UNAVAILABLE: No connection established') }), 'UNAVAILABLE', 503],
    ['DEADLINE_EXCEEDED inside a ServiceError', new ServiceError('Failed to query Workflow', { cause: grpc(4, '4 DEADLINE_EXCEEDED') }), 'UNAVAILABLE', 503],
    ['NOT_FOUND inside a ServiceError', new ServiceError('Failed to query Workflow', { cause: grpc(5, '5 NOT_FOUND: workflow not found') }), 'NOT_FOUND', 404],
    ['an update refused by its validator', new WorkflowUpdateFailedError('failed', ApplicationFailure.create({ type: 'INVALID_ARGUMENT', message: 'stop: takes no arguments, got 1' })), 'INVALID_ARGUMENT', 400],
    ['anything else', new Error('boom'), 'INTERNAL', 500],
  ])('%s', (_what, err, code, httpStatus) => {
    expect(toStasisError(err, 'run r1')).toMatchObject({ code, httpStatus });
  });

  test('an unavailable server is named with the cause, not the wrapper', () => {
    const wrapped = new ServiceError('Failed to list workflows', { cause: grpc(14, '14 UNAVAILABLE: No connection established') });
    expect(toStasisError(wrapped, 'runs').message).toBe('Temporal is unavailable: 14 UNAVAILABLE: No connection established');
  });
});
