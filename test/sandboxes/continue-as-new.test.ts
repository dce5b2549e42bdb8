import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { useStack, startStackOnOwnTemporal, eventually } from '../helpers/stack';

// A Temporal server of its own that suggests continue-as-new after a few events: the sandbox
// workflow must never continue as new while a release (or anything else) is under way.
const faults: ReleaseFaults = { calls: [] };
const stack = useStack(() => startStackOnOwnTemporal(40, { worker: { providers: [faultyProvider(faults)] } }));

/** Activities of `type` a run scheduled and never saw end (completed, failed, timed out or cancelled). */
async function openActivities(workflowId: string, runId: string, type: string): Promise<number> {
  const history = await stack.temporal.workflow.getHandle(workflowId, runId).fetchHistory();
  const open = new Set<string>();
  for (const event of history.events ?? []) {
    if (event.activityTaskScheduledEventAttributes?.activityType?.name === type) open.add(String(event.eventId));
    const closed =
      event.activityTaskCompletedEventAttributes ??
      event.activityTaskFailedEventAttributes ??
      event.activityTaskTimedOutEventAttributes ??
      event.activityTaskCanceledEventAttributes;
    if (closed) open.delete(String(closed.scheduledEventId));
  }
  return open.size;
}

test('continue-as-new waits for a release that started while it waited for handlers', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'faulty' });
  const workflowId = `sandbox-${sandboxId}`;
  await stack.client.sandboxes.start(sandboxId);
  let open = () => {};
  faults.writeGate = new Promise<void>((resolve) => (open = resolve));
  const write = stack.client.sandboxes.writeFile(sandboxId, 'slow.txt', Buffer.from('slow'));
  await eventually(
    async () => faults.writeCalls?.some((c) => c.sandboxId === sandboxId && c.outcome === 'held'),
    20_000,
    'write held',
  );
  // Enough history for the server to suggest continue-as-new while the write is still under way.
  const handle = stack.temporal.workflow.getHandle(workflowId);
  while (((await handle.fetchHistory()).events?.length ?? 0) < 45) {
    await stack.client.sandboxes.exec(sandboxId, { command: 'true' });
  }
  // A suspend whose release never answers, while the workflow waits for the write to finish.
  faults.releasePlan = (id) => (id === sandboxId ? 'hang' : undefined);
  const suspend = await stack.client.sandboxes.suspend(sandboxId).then(
    (view) => view,
    (err: { code?: string }) => err,
  );
  if ('code' in suspend) expect(suspend.code).toBe('SANDBOX_SUSPEND_BUSY');
  open();
  faults.writeGate = undefined;
  await write;
  if (!('code' in suspend)) {
    // The release is still hanging: wait until it is known to the workflow whether it continued as new.
    await eventually(
      async () => faults.calls.some((c) => c.sandboxId === sandboxId && c.outcome === 'hung'),
      20_000,
      'release hung',
    );
  }
  await stack.client.sandboxes.exec(sandboxId, { command: 'true' }).catch(() => undefined);

  const runs: string[] = [];
  for await (const wf of stack.temporal.workflow.list({ query: `WorkflowId = '${workflowId}'` })) {
    if (wf.status.name === 'CONTINUED_AS_NEW') runs.push(wf.runId);
  }
  for (const runId of runs) expect(await openActivities(workflowId, runId, 'releaseSandbox')).toBe(0);
  const view = await stack.client.sandboxes.get(sandboxId);
  // A sandbox that says RELEASING has its release under way in this run.
  if (view.record.state === 'RELEASING') {
    expect(await openActivities(workflowId, (await handle.describe()).runId, 'releaseSandbox')).toBe(1);
  }
  faults.releasePlan = undefined;
  await stack.client.sandboxes.destroy(sandboxId);
}, 240_000);
