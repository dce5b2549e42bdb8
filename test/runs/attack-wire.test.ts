import { WorkflowFailedError, type WorkflowHandle } from '@temporalio/client';
import fc from 'fast-check';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { RunSpec } from '../../common/schemas';
import { actUpdate } from '../../workflows/definitions';
import { PATCH_SPEC_CHECKED } from '../../workflows/run-workflow';
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

test('a Run started straight through Temporal with a spec the wire schema refuses fails at once, naming the field; a valid one runs', async () => {
  // Before the check each of these failed its first workflow task again and again (reading a
  // field of nothing): RUNNING for good, with no history a cancel or a person could act on.
  const refused: [unknown, RegExp][] = [
    [{}, /^spec\.(agent|sandbox)\b/],
    [{ sandbox: { provider: 'local' } }, /^spec\.agent\b/],
    [{ agent: { driver: 'external' } }, /^spec\.sandbox\b/],
    [
      { agent: { driver: 'external' }, sandbox: { provider: 'local' }, policy: { ttl: 'soon' } },
      /^spec\.policy\.ttl\b/,
    ],
    [{ agent: { driver: 'scripted', steps: 'ask' }, sandbox: { provider: 'local' } }, /^spec\.agent\.steps\b/],
  ];
  const start = (spec: unknown) =>
    stack.temporal.workflow.start('runWorkflow', {
      taskQueue: stack.config.STASIS_TASK_QUEUE,
      workflowId: `run-raw-${randomUUID()}`,
      args: [{ spec }],
    });
  const outcome = async (handle: WorkflowHandle) =>
    Promise.race([
      handle.result().then(
        () => 'completed',
        (err: unknown) => err,
      ),
      sleep(30_000).then(() => 'still running after 30 s'),
    ]);
  for (const [spec, field] of refused) {
    const handle = await start(spec);
    const err = await outcome(handle);
    expect(err).toBeInstanceOf(WorkflowFailedError);
    expect((err as WorkflowFailedError).cause).toMatchObject({
      type: 'INVALID_ARGUMENT',
      nonRetryable: true,
      message: expect.stringMatching(field),
    });
  }
  // A valid spec started the same way runs, and asks for no patch on the way (its history is as before).
  const valid = await start({
    agent: { driver: 'scripted', steps: [{ complete: 'ok' }] },
    sandbox: { provider: 'local' },
  });
  expect(await outcome(valid)).toBe('completed');
  const patches = ((await valid.fetchHistory()).events ?? []).flatMap((e) => {
    const marker = e.markerRecordedEventAttributes;
    if (marker?.markerName !== 'core_patch') return [];
    return (marker.details?.['patch-data']?.payloads ?? []).map((p) => Buffer.from(p.data ?? []).toString());
  });
  expect(patches.length).toBeGreaterThan(0); // the Run's baseline marker, read as the check reads it
  expect(patches.join()).not.toContain(PATCH_SPEC_CHECKED);
}, 240_000);
