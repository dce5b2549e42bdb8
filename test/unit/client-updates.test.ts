import { WorkflowUpdateFailedError } from '@temporalio/client';
import { ActivityFailure, ApplicationFailure, RetryState } from '@temporalio/common';
import { isRefusedForNow, sendUpdate } from '../../client/updates';

// The client's Update retry: the same update id on every attempt, retried only
// while Temporal is unavailable or past its deadline.

const grpcError = (code: number, message: string) => Object.assign(new Error(message), { code });

it('retries DEADLINE_EXCEEDED, UNAVAILABLE and an Update its workflow task failed under, under one update id, then returns the outcome', async () => {
  const ids: string[] = [];
  const failures = [
    grpcError(4, 'context deadline exceeded'),
    new Error('wrapped', { cause: grpcError(14, 'unavailable') }),
    // The server's WorkflowNotReady for an Update handed to a workflow task that then failed.
    grpcError(9, 'Unable to perform workflow execution update due to unexpected workflow task failure.'),
    // Its answer while that task fails again (a completion past gRPC's 4 MB).
    grpcError(9, 'Workflow Task in failed state.'),
  ];
  const outcome = await sendUpdate(async (updateId) => {
    ids.push(updateId);
    const failure = failures.shift();
    if (failure) throw failure;
    return 'answered';
  }, 'update-1');
  expect(outcome).toBe('answered');
  expect(ids).toEqual(['update-1', 'update-1', 'update-1', 'update-1', 'update-1']);
});

it('passes another FAILED_PRECONDITION through at once', async () => {
  let calls = 0;
  const other = grpcError(9, 'namespace is not active');
  await expect(
    sendUpdate(async () => {
      calls += 1;
      throw other;
    }),
  ).rejects.toBe(other);
  expect(calls).toBe(1);
});

it('passes any other error through at once', async () => {
  let calls = 0;
  const refused = Object.assign(new Error('ALREADY_ANSWERED'), { code: 'ALREADY_ANSWERED' });
  await expect(
    sendUpdate(async () => {
      calls += 1;
      throw refused;
    }),
  ).rejects.toBe(refused);
  expect(calls).toBe(1);
});

it('gives every call its own update id unless one is given', async () => {
  const ids = new Set<string>();
  for (let i = 0; i < 3; i += 1) await sendUpdate(async (updateId) => ids.add(updateId));
  expect(ids.size).toBe(3);
});

/** An Update's failure as the client raises it, over what the workflow threw. */
const updateFailed = (cause: Error) => new WorkflowUpdateFailedError('Workflow Update failed', cause);
const forNow = () =>
  updateFailed(
    ApplicationFailure.create({ type: 'UNAVAILABLE', message: 'continuing as new; retry', nonRetryable: false }),
  );

it('retries an Update its workflow refused for now, under one update id, then returns the outcome', async () => {
  const ids: string[] = [];
  let refusals = 2;
  const outcome = await sendUpdate(async (updateId) => {
    ids.push(updateId);
    if (refusals-- > 0) throw forNow();
    return 'taken';
  }, 'update-2');
  expect(outcome).toBe('taken');
  expect(ids).toEqual(['update-2', 'update-2', 'update-2']);
});

it('tells a refusal for now from an outcome', () => {
  expect(isRefusedForNow(forNow())).toBe(true);
  // The same failure outside an Update's is no refusal of one.
  expect(isRefusedForNow(forNow().cause)).toBe(false);
  // Non-retryable: the Update's outcome (a resume whose host is gone); Temporal would answer it again.
  expect(
    isRefusedForNow(
      updateFailed(ApplicationFailure.create({ type: 'UNAVAILABLE', message: 'host gone', nonRetryable: true })),
    ),
  ).toBe(false);
  // Another code, even retryable.
  expect(
    isRefusedForNow(updateFailed(ApplicationFailure.create({ type: 'INTERNAL', message: 'x', nonRetryable: false }))),
  ).toBe(false);
  // An activity's UNAVAILABLE under the Update's failure is the Update's outcome too.
  const activity = new ActivityFailure(
    'activity failed',
    'execInSandbox',
    '1',
    RetryState.MAXIMUM_ATTEMPTS_REACHED,
    undefined,
    ApplicationFailure.create({ type: 'UNAVAILABLE', message: 'down', nonRetryable: false }),
  );
  expect(isRefusedForNow(updateFailed(activity))).toBe(false);
});
