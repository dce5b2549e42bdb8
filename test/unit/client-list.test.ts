import { ServiceError, type Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/common';
import { StasisClient, StasisError } from '../../client';
import { PENDING_MEMO } from '../../common/interactions';
import type { RunSnapshot } from '../../common/schemas';

// Which listed Runs runs.list and pendingInteractions answer, leave out, or fail on, over a
// Temporal client that lists the given executions and answers each query as told. A Run whose
// query failed was left out silently (found by the library attack review); test/runs/list-failures
// shows the same against a real server.

interface Listed {
  workflowId: string;
  taskQueue?: string;
  status?: string;
  memo?: Record<string, unknown>;
}

const grpc = (code: number, message: string) => Object.assign(new Error(message), { code });
const noPoller = () =>
  new ServiceError('Failed to query Workflow', {
    cause: grpc(9, '9 FAILED_PRECONDITION: no poller seen for task queue recently, worker may be down'),
  });
const snapshot = (runId: string, pending = false): RunSnapshot => ({
  runId,
  status: pending ? 'WAITING' : 'RUNNING',
  interactions: pending
    ? [{ id: 'int-1', kind: 'approval', prompt: 'ok?', createdAt: '2026-01-01T00:00:00.000Z', status: 'pending' }]
    : [],
  childRunIds: [],
});

/** A client over `listed`, whose queries answer `query(id)` and descriptions `describe(id)`; the ids queried. */
function over(
  listed: Listed[],
  query: (id: string) => Promise<RunSnapshot>,
  describe: (id: string) => Promise<unknown> = async () => ({ status: { name: 'RUNNING' } }),
): { client: StasisClient; queried: string[] } {
  const queried: string[] = [];
  const temporal = {
    connection: {},
    workflow: {
      list: async function* () {
        for (const wf of listed)
          yield {
            taskQueue: 'q',
            status: { name: 'RUNNING' },
            startTime: new Date('2026-01-01T00:00:00Z'),
            ...wf,
            ...(wf.status ? { status: { name: wf.status } } : {}),
          };
      },
      getHandle: (id: string) => ({
        query: () => {
          queried.push(id);
          return query(id);
        },
        describe: () => describe(id),
      }),
    },
  } as unknown as Client;
  return { client: new StasisClient(temporal, { taskQueue: 'q' }), queried };
}

test("list answers the Runs of the client's task queue, leaves out one deleted since the listing, and fails naming a Run it cannot read", async () => {
  const { client, queried } = over(
    [{ workflowId: 'run-a' }, { workflowId: 'run-gone' }, { workflowId: 'run-other', taskQueue: 'other-deployment' }],
    async (id) => {
      if (id === 'run-gone') throw new WorkflowNotFoundError('not found', id, undefined);
      return snapshot(id);
    },
  );
  expect((await client.runs.list()).map((r) => r.runId)).toEqual(['run-a']);
  expect(queried.sort()).toEqual(['run-a', 'run-gone']);

  for (const [failure, code] of [
    [noPoller(), 'UNAVAILABLE'],
    [
      new ServiceError('Failed to query Workflow', { cause: grpc(4, '4 DEADLINE_EXCEEDED: query timed out') }),
      'UNAVAILABLE',
    ],
    [new Error('nondeterminism'), 'INTERNAL'],
  ] as const) {
    const failing = over([{ workflowId: 'run-a' }, { workflowId: 'run-b' }], async (id) => {
      if (id === 'run-b') throw failure;
      return snapshot(id);
    }).client;
    const err = await failing.runs.list().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StasisError);
    expect(err).toMatchObject({ code, message: expect.stringMatching(/^runs: run run-b could not be read \(.+\)$/) });
  }
  // The cause named is the server's, not the client's wrapper ("Failed to query Workflow").
  const err = await over([{ workflowId: 'run-b' }], () => Promise.reject(noPoller()))
    .client.runs.list()
    .catch((e: unknown) => e);
  expect((err as Error).message).toContain('no poller seen for task queue recently');
});

test('pendingInteractions fails naming a Run it must query and cannot, unless that Run closed since the listing or is gone', async () => {
  const listed = [{ workflowId: 'run-memo', memo: { [PENDING_MEMO]: [] } }, { workflowId: 'run-old' }];
  // The memo answers without a query; a memo-less Run is queried.
  const answered = over(listed, async (id) => snapshot(id, true));
  const page = await answered.client.runs.pendingInteractions();
  expect(page.interactions.map((p) => [p.runId, p.interaction.id])).toEqual([['run-old', 'int-1']]);
  expect(answered.queried).toEqual(['run-old']);

  const failing = (describe: () => Promise<unknown>) =>
    over(listed, () => Promise.reject(noPoller()), describe).client.runs.pendingInteractions();
  // Still running: it may be waiting on someone, and the call cannot say.
  await expect(failing(async () => ({ status: { name: 'RUNNING' } }))).rejects.toMatchObject({
    code: 'UNAVAILABLE',
    message: expect.stringMatching(/^interactions: run run-old could not be read \(.*no poller/),
  });
  // Not known to be closed: the same.
  await expect(failing(() => Promise.reject(noPoller()))).rejects.toMatchObject({ code: 'UNAVAILABLE' });
  // Closed since the listing: a closed Run waits on no one.
  await expect(failing(async () => ({ status: { name: 'COMPLETED' } }))).resolves.toEqual({ interactions: [] });
  // Gone since the listing.
  await expect(
    over(listed, (id) =>
      Promise.reject(new WorkflowNotFoundError('not found', id, undefined)),
    ).client.runs.pendingInteractions(),
  ).resolves.toEqual({ interactions: [] });
  // Another deployment's Run, on another task queue, is not this client's to list.
  const other = over([{ workflowId: 'run-old', taskQueue: 'other-deployment' }], () => Promise.reject(noPoller()));
  await expect(other.client.runs.pendingInteractions()).resolves.toEqual({ interactions: [] });
  expect(other.queried).toEqual([]);
});
