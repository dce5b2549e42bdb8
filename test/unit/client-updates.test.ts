import { sendUpdate } from '../../client/updates';

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
  ];
  const outcome = await sendUpdate(async (updateId) => {
    ids.push(updateId);
    const failure = failures.shift();
    if (failure) throw failure;
    return 'answered';
  }, 'update-1');
  expect(outcome).toBe('answered');
  expect(ids).toEqual(['update-1', 'update-1', 'update-1', 'update-1']);
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
