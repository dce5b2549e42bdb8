import { historiesOfEveryExecution } from '../helpers/patches';
import { useStack, startStackOnOwnTemporal } from '../helpers/stack';

// A Temporal server of its own that suggests continue-as-new after a few events,
// so long Runs and sandboxes really continue as new and carry their whole state.
const stack = useStack(() => startStackOnOwnTemporal(40));

async function runCount(workflowId: string): Promise<number> {
  let n = 0;
  for await (const _ of stack.temporal.workflow.list({ query: `WorkflowId = '${workflowId}'` })) n += 1;
  return n;
}

test('a long Run continues as new and carries its whole aggregate (interactions, checkpoint, record)', async () => {
  const steps = [
    { writeFile: { path: 'log.txt', content: '' } },
    { ask: 'first?' },
    ...Array.from({ length: 12 }, (_, i) => ({ exec: `echo ${i} >> log.txt` })),
    { ask: 'second?' },
    { exec: 'wc -l < log.txt' },
  ];
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps },
    sandbox: { provider: 'local' },
  });
  const handle = stack.temporal.workflow.getHandle(runId);
  const waitFor = async (id: string) => {
    for (;;) {
      const s = await stack.client.runs.get(runId);
      if (s.interactions.some((i) => i.id === id && i.status === 'pending')) return;
      await new Promise((r) => setTimeout(r, 200));
    }
  };
  await waitFor('int-1');
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await waitFor('int-2');
  await stack.client.runs.respond(runId, 'int-2', { decision: 'approve' });
  const output = await handle.result();
  expect(output).toMatchObject({ exitCode: 0, stdout: '12\n' });
  expect(await runCount(runId)).toBeGreaterThan(1);
  const snapshot = await stack.client.runs.get(runId);
  // The first interaction, answered before continue-as-new, is still in the aggregate.
  expect(snapshot.interactions.map((i) => [i.id, i.status])).toEqual([
    ['int-1', 'answered'],
    ['int-2', 'answered'],
  ]);
  expect(snapshot.status).toBe('COMPLETED');
});

test('a Run on a worker without a webhook starts no webhook delivery, before or after it continues as new', async () => {
  // The worker's "no webhook" is learnt at provision; before it was carried, every ask, answer and
  // the end of a continued Run started a delivery workflow that found no webhook (a workflow, an
  // activity and their events for nothing, per interaction).
  const steps = [
    { ask: 'first?' },
    ...Array.from({ length: 12 }, (_, i) => ({ exec: `echo ${i}` })),
    { ask: 'second?' },
    { complete: 'done' },
  ];
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps },
    sandbox: { provider: 'local' },
  });
  for (const id of ['int-1', 'int-2']) {
    for (;;) {
      const s = await stack.client.runs.get(runId);
      if (s.interactions.some((i) => i.id === id && i.status === 'pending')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    await stack.client.runs.respond(runId, id, { decision: 'approve' });
  }
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
  const executions = await historiesOfEveryExecution(stack.config, runId);
  expect(executions.length).toBeGreaterThan(1);
  const deliveries = executions.map(
    (events) =>
      events.filter(
        (e) => e.startChildWorkflowExecutionInitiatedEventAttributes?.workflowType?.name === 'webhookDeliveryWorkflow',
      ).length,
  );
  expect(deliveries).toEqual(executions.map(() => 0));
});

test('a busy standalone sandbox continues as new and keeps its state and workspace', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  for (let i = 0; i < 12; i++) await stack.client.sandboxes.exec(sandboxId, { command: `echo ${i} >> n.txt` });
  const view = await stack.client.sandboxes.get(sandboxId);
  expect(view.state).toBe('running');
  await expect(stack.client.sandboxes.exec(sandboxId, { command: 'wc -l < n.txt' })).resolves.toMatchObject({
    stdout: '12\n',
  });
  expect(await runCount(`sandbox-${sandboxId}`)).toBeGreaterThan(1);
  await stack.client.sandboxes.destroy(sandboxId);
});

test('a child Run survives its parent continuing as new and stays linked to it', async () => {
  const parentId = `parent-can-${Date.now()}`;
  const childId = `${parentId}.c1`;
  const steps = [
    {
      spawn: {
        runId: childId,
        agent: { driver: 'scripted', steps: [{ ask: 'child may go?' }, { complete: 'child done' }] },
        sandbox: { provider: 'local' },
      },
    },
    ...Array.from({ length: 12 }, (_, i) => ({ exec: `echo ${i}` })),
    { complete: 'parent done' },
  ];
  await stack.client.runs.start({
    runId: parentId,
    agent: { driver: 'scripted', steps },
    sandbox: { provider: 'local' },
  });
  // The parent continues as new while the child waits for its answer.
  const deadline = Date.now() + 60_000;
  while ((await runCount(parentId)) < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  expect(await runCount(parentId)).toBeGreaterThan(1);
  const waiting = async () => {
    for (;;) {
      const s = await stack.client.runs.get(childId);
      if (s.status !== 'RUNNING') return s;
      await new Promise((r) => setTimeout(r, 200));
    }
  };
  const child = await waiting();
  expect(child).toMatchObject({ status: 'WAITING', parentRunId: parentId });
  await stack.client.runs.respond(childId, 'int-1', { decision: 'approve' });
  await expect(stack.temporal.workflow.getHandle(parentId).result()).resolves.toBe('parent done');
  expect((await stack.client.runs.get(childId)).status).toBe('COMPLETED');
  expect((await stack.client.runs.resource(parentId)).children).toEqual([{ runId: childId, state: 'DESTROYED' }]);
});

test("an external agent's Run continues as new and still never runs a retried action twice", async () => {
  const { runId } = await stack.client.runs.start({ agent: { driver: 'external' }, sandbox: { provider: 'local' } });
  const act = async (actionId: string, command: string) => {
    const view = await stack.client.runs.act(
      runId,
      { actionId, action: { type: 'exec', command } },
      { waitMs: 60_000 },
    );
    expect(view).toMatchObject({ actionId, status: 'succeeded' });
    return view;
  };
  const first = await act('a0', 'echo 0 >> n.txt; echo first');
  for (let i = 1; i < 12; i++) await act(`a${i}`, `echo ${i} >> n.txt`);
  expect(await runCount(runId)).toBeGreaterThan(1);
  // Sent again after continue-as-new: the same outcome, and the command did not run again.
  expect(await act('a0', 'echo 0 >> n.txt; echo first')).toEqual(first);
  await expect(
    stack.client.runs.act(runId, { actionId: 'a0', action: { type: 'exec', command: 'echo other' } }),
  ).rejects.toMatchObject({ code: 'IDEMPOTENCY_CONFLICT' });
  expect((await act('count', 'wc -l < n.txt')).result).toMatchObject({ stdout: '12\n' });
  await stack.client.runs.act(runId, { actionId: 'end', action: { type: 'complete', output: 'done' } });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
});
