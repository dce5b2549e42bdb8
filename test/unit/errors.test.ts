import fc from 'fast-check';
import { ActivityFailure, ApplicationFailure, RetryState } from '@temporalio/common';
import { ServiceError } from '@temporalio/client';
import { toFailure } from '../../activities/failures';
import { httpFailure } from '../../api/errors';
import { grpcErrorOf, toStasisError } from '../../client/errors';
import {
  causeChain,
  END_REASON,
  ERROR_STATUS,
  GRPC_STATUS,
  isErrorCode,
  NON_RETRYABLE_CODES,
  nonRetryableErrorTypes,
  StasisError,
  toInternal,
  type ErrorCode,
} from '../../common/errors';
import { RELEASE_RETRY } from '../../workflows/lifecycle';
import { failureCode, failureMessage } from '../../workflows/failures';

// The one error module: every code's HTTP status and whether a retry can fix it,
// written out here by hand so a changed or added code must change this table too.

const TABLE: [ErrorCode, number, 'retryable' | 'final'][] = [
  ['INVALID_ARGUMENT', 400, 'final'],
  ['UNAUTHORIZED', 401, 'retryable'],
  ['FORBIDDEN', 403, 'retryable'],
  ['NOT_FOUND', 404, 'final'],
  ['ALREADY_EXISTS', 409, 'retryable'],
  ['INVALID_STATE_TRANSITION', 409, 'final'],
  ['SANDBOX_SUSPEND_BUSY', 409, 'retryable'],
  ['ALREADY_ANSWERED', 409, 'retryable'],
  ['STALE_SANDBOX_ROUTE', 409, 'retryable'],
  ['STALE_FENCE', 409, 'final'],
  ['IDEMPOTENCY_CONFLICT', 409, 'final'],
  ['RESUME_HASH_MISMATCH', 409, 'retryable'],
  ['JOB_INTERRUPTED', 409, 'final'],
  ['CHECKPOINT_INVALID', 422, 'final'],
  ['PAYLOAD_TOO_LARGE', 413, 'retryable'],
  ['HEADERS_TOO_LARGE', 431, 'final'],
  ['REQUEST_TIMEOUT', 408, 'final'],
  ['NOT_SUPPORTED', 501, 'final'],
  ['INTERNAL', 500, 'retryable'],
  ['SANDBOX_FAILED', 500, 'final'],
  ['UNAVAILABLE', 503, 'retryable'],
];

describe('error codes', () => {
  test('the table names every code, once', () => {
    expect(TABLE.map(([code]) => code).sort()).toEqual(Object.keys(ERROR_STATUS).sort());
  });

  test.each(TABLE)('%s: HTTP %i, %s', (code, status, retry) => {
    expect(isErrorCode(code)).toBe(true);
    expect(ERROR_STATUS[code]).toBe(status);
    const error = new StasisError(code, 'because');
    expect(error).toMatchObject({ code, httpStatus: status, message: 'because', name: 'StasisError' });
    expect(NON_RETRYABLE_CODES.includes(code)).toBe(retry === 'final');
    // An activity raising it: Temporal retries it or not by the same word.
    const failure = toFailure(error) as ApplicationFailure;
    expect(failure).toBeInstanceOf(ApplicationFailure);
    expect(failure).toMatchObject({ type: code, message: 'because', nonRetryable: retry === 'final' });
    // The client names it back with the same code and status.
    expect(toStasisError(new Error('update failed', { cause: failure }), 'run r1')).toMatchObject({
      code,
      httpStatus: status,
    });
  });

  test.each(['', 'internal', 'TTL_EXPIRED', 'toString', 'hasOwnProperty', '__proto__', 4, null, undefined])(
    '%p is not an error code',
    (value) => {
      expect(isErrorCode(value)).toBe(false);
    },
  );

  test('end reasons are not error codes: a Run that ended is not a refusal', () => {
    for (const reason of Object.values(END_REASON)) expect(isErrorCode(reason)).toBe(false);
  });
});

describe('the one non-retryable set', () => {
  test('every retry policy derives from it: release lists exactly it', () => {
    expect([...RELEASE_RETRY.nonRetryableErrorTypes].sort()).toEqual([...NON_RETRYABLE_CODES].sort());
  });

  test("a policy's list is its own copy: changing one cannot change the set", () => {
    const list = nonRetryableErrorTypes();
    list.push('UNAVAILABLE');
    expect(NON_RETRYABLE_CODES).not.toContain('UNAVAILABLE');
    expect(nonRetryableErrorTypes()).not.toContain('UNAVAILABLE');
  });
});

describe('unknown errors become INTERNAL, once', () => {
  test.each([
    ['an Error', new Error('disk on fire'), undefined, 'disk on fire'],
    ['an Error, for a named thing', new Error('disk on fire'), 'run r1', 'run r1: disk on fire'],
    ['a thrown string', 'plain words', undefined, 'plain words'],
    ['a thrown object', { weird: true }, 'sandbox s1', 'sandbox s1: [object Object]'],
  ])('%s', (_what, err, what, message) => {
    expect(toInternal(err, what)).toMatchObject({ code: 'INTERNAL', httpStatus: 500, message });
  });

  test('a StasisError keeps its own code and message', () => {
    const refused = new StasisError('STALE_FENCE', 'fence 3 < 4');
    expect(toInternal(refused, 'run r1')).toBe(refused);
  });

  test.each([
    ['a body over the limit', 'PAYLOAD_TOO_LARGE', 413, { statusCode: 413, message: 'too large' }],
    ['bad JSON', 'INVALID_ARGUMENT', 400, { statusCode: 400, message: 'Unexpected token' }],
    ['a wrong content type', 'INVALID_ARGUMENT', 400, { statusCode: 415, message: 'Unsupported Media Type' }],
    ['a crash', 'INTERNAL', 500, new Error('secret path /var/lib/x')],
  ])('the API maps %s to %s (HTTP %i)', (_what, code, status, err) => {
    const failure = httpFailure(err, 1024);
    expect(failure).toMatchObject({ code, httpStatus: status });
    // A crash's own words stay in the server log, never in the answer.
    expect(failure.message).not.toContain('secret');
  });
});

describe('the cause-chain walker', () => {
  const chainOf = (messages: string[], loopTo: number | undefined): Error[] => {
    const errors = messages.map((m) => new Error(m));
    errors.forEach((e, i) => Object.assign(e, { cause: errors[i + 1] }));
    if (loopTo !== undefined) Object.assign(errors[errors.length - 1], { cause: errors[loopTo] });
    return errors;
  };

  test('yields each error once, outermost first, and ends on a cycle or a non-Error cause', () => {
    fc.assert(
      fc.property(
        fc.array(fc.string(), { minLength: 1, maxLength: 8 }),
        fc.option(fc.nat(), { nil: undefined }),
        (messages, loop) => {
          const errors = chainOf(messages, loop === undefined ? undefined : loop % messages.length);
          expect([...causeChain(errors[0])]).toEqual(errors);
        },
      ),
    );
  });

  test('a non-Error yields nothing', () => {
    expect([...causeChain('boom')]).toEqual([]);
    expect([...causeChain(undefined)]).toEqual([]);
  });

  // Each of these walked `cause` with no end before there was one walker: an error whose
  // cause leads back to itself hung the workflow task or the client call.
  test('a failure chain that loops back ends: message, code, gRPC status and client error', () => {
    const inner = ApplicationFailure.create({ type: 'NOT_FOUND', message: 'no such file' });
    const outer = new ActivityFailure('activity failed', 'readFile', '1', RetryState.NON_RETRYABLE_FAILURE, undefined);
    Object.assign(outer, { cause: inner });
    Object.assign(inner, { cause: outer });
    expect(failureMessage(outer)).toBe('readFile: no such file');
    expect(failureCode(outer)).toBe('NOT_FOUND');
    expect(grpcErrorOf(outer)).toBeUndefined();
    expect(toStasisError(outer, 'file')).toMatchObject({ code: 'NOT_FOUND', message: 'no such file' });
  });

  test('the client finds a gRPC status under the wrapper, and names statuses by their constants', () => {
    const status = Object.assign(new Error('14 UNAVAILABLE: down'), { code: GRPC_STATUS.UNAVAILABLE });
    const wrapped = new ServiceError('Failed to query Workflow', { cause: status });
    expect(grpcErrorOf(wrapped)).toEqual({ code: 14, message: '14 UNAVAILABLE: down' });
    expect(toStasisError(wrapped, 'run r1')).toMatchObject({ code: 'UNAVAILABLE', httpStatus: 503 });
    expect(GRPC_STATUS).toEqual({ DEADLINE_EXCEEDED: 4, NOT_FOUND: 5, FAILED_PRECONDITION: 9, UNAVAILABLE: 14 });
  });
});
