import fc from 'fast-check';
import { RunSpec } from '../../common/schemas';
import { actUpdate } from '../../workflows/definitions';
import { eventually, saw, startStack, type TestStack } from '../helpers/stack';

// An external agent that talks to Temporal directly, past the client's and the API's
// wire schemas: what the Run's own check lets through is what the worker runs.
// Real worker, real Temporal.

let stack: TestStack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack?.stop();
});

/** The workflow ids of every execution whose id starts with `prefix` (the Run and its children). */
async function executions(prefix: string): Promise<string[]> {
  const ids: string[] = [];
  for await (const wf of stack.temporal.workflow.list({ query: `WorkflowId STARTS_WITH '${prefix}'` })) {
    ids.push(wf.workflowId);
  }
  return ids.sort();
}

const eventTypes = async (workflowId: string): Promise<string[]> =>
  ((await stack.temporal.workflow.getHandle(workflowId).fetchHistory()).events ?? []).map((e) => String(e.eventType));

test('a spawn whose spec the wire schema refuses, sent straight through Temporal, is refused before history; no child is started', async () => {
  const { runId } = await stack.client.runs.start({ agent: { driver: 'external' }, sandbox: { provider: 'local' } });
  const handle = stack.temporal.workflow.getHandle(runId);
  // Settled first (its sandbox provisioned), so any event after this is the attack's doing.
  await eventually(
    async () => saw(await stack.client.runs.resource(runId)).record.state === 'ACTIVE',
    60_000,
    'sandbox active',
  );
  const before = await eventTypes(runId);

  // Before the fix each of these started a child Run that failed its first workflow task
  // forever (reading spec.sandbox.provider or spec.agent.driver of nothing): stuck RUNNING,
  // out of reach of a cancel, and its parent could never complete.
  const known: unknown[] = [
    {},
    { sandbox: { provider: 'local' } },
    { agent: { driver: 'external' } },
    { agent: 'x', sandbox: 5 },
    { agent: { driver: 'external' }, sandbox: { provider: 'local' }, policy: { ttl: 'soon' } },
  ];
  // And specs drawn from the wire: a valid one with one field broken.
  const drawn = fc.sample(
    fc
      .record({
        field: fc.constantFrom('agent', 'sandbox', 'policy', 'labels', 'runId'),
        value: fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.constantFrom(null, {}, [], '', { driver: 7 })),
      })
      .map(({ field, value }) => ({ agent: { driver: 'external' }, sandbox: { provider: 'local' }, [field]: value }))
      .filter((spec) => !RunSpec.safeParse(spec).success),
    8,
  );
  for (const [i, spec] of [...known, ...drawn].entries()) {
    await expect(
      handle.executeUpdate(actUpdate, { args: [{ actionId: `spawn-${i}`, action: { type: 'spawn', spec } } as never] }),
    ).rejects.toMatchObject({
      cause: { type: 'INVALID_ARGUMENT', message: expect.stringMatching(/^action\.spec\b/) },
    });
  }

  // Nothing changed: no action, no child, no new event on the Run.
  expect(await stack.client.runs.get(runId)).toMatchObject({ status: 'RUNNING', childRunIds: [] });
  expect(await stack.client.runs.action(runId, 'spawn-0').catch((err: { code?: string }) => err.code)).toBe(
    'NOT_FOUND',
  );
  expect(await executions(runId)).toEqual([runId]);
  expect(await eventTypes(runId)).toEqual(before);

  // The Run still takes a good spawn and completes once its child has.
  const child = await handle.executeUpdate(actUpdate, {
    args: [
      {
        actionId: 'good',
        action: {
          type: 'spawn',
          spec: { agent: { driver: 'scripted', steps: [{ complete: 'child done' }] }, sandbox: { provider: 'local' } },
        },
      },
    ],
  });
  expect(child).toMatchObject({ actionId: 'good' });
  await eventually(
    async () => saw(await stack.client.runs.action(runId, 'good')).status === 'succeeded',
    60_000,
    'spawned',
  );
  await handle.executeUpdate(actUpdate, { args: [{ actionId: 'end', action: { type: 'complete', output: 'ok' } }] });
  await eventually(async () => saw(await stack.client.runs.get(runId)).status === 'COMPLETED', 120_000, 'completed');
}, 240_000);
