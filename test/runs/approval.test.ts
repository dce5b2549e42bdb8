import {
  legacyResumeRunUpdate,
  legacySuspendRunUpdate,
  resumeRunUpdate,
  suspendRunUpdate,
} from '../../workflows/definitions';
import { releasedView } from '../helpers/runs';
import { useStack, eventually } from '../helpers/stack';
import { checkpointKeys, testS3 } from '../helpers/s3';

const s3 = testS3();
const stack = useStack();

const spec = (onDeny: 'fail' | 'continue' = 'continue') => ({
  agent: {
    driver: 'scripted',
    steps: [
      { writeFile: { path: 'notes/plan.txt', content: 'step one\n' } },
      { exec: 'sleep 300', background: true },
      { ask: 'Run the migration?', onDeny },
      { expectFile: { path: 'notes/plan.txt', content: 'step one\n' } },
      { exec: 'cat notes/plan.txt && echo done' },
      { complete: 'migrated' },
    ],
  },
  sandbox: { provider: 'local' },
});

const waitForRelease = (runId: string) => releasedView(stack.client, runId, 60_000);

test('writeFile → ask → expectFile → exec → complete: released while waiting, restored on approve', async () => {
  const { runId } = await stack.client.runs.start(spec());
  const view = await waitForRelease(runId);
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('WAITING');
  expect(snapshot.interactions).toEqual([
    expect.objectContaining({ id: 'int-1', status: 'pending', prompt: 'Run the migration?' }),
  ]);
  expect(snapshot).not.toHaveProperty('record');
  expect(view.phase).toBe('SUSPENDED');
  expect(view.record.pauseMode).toBe('SNAPSHOT_AND_TERMINATE');
  expect(view.record.checkpoint?.uri).toMatch(/^s3:\/\/.+\/checkpoints\//);
  expect(view.suspension).toMatchObject({
    reason: 'INTERACTION',
    interactionIds: ['int-1'],
    pauseMode: 'SNAPSHOT_AND_TERMINATE',
  });
  const provider = stack.workers.get('host-a')!.registry.get('local');
  expect(await provider.processCount(view.record.sandboxId)).toBe(0);
  expect(await checkpointKeys(s3, view.record.sandboxId)).toHaveLength(1);

  const answered = await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { respondedBy: 'alice' });
  expect(answered).toMatchObject({ status: 'answered', respondedBy: 'alice', response: { decision: 'approve' } });
  const output = await stack.temporal.workflow.getHandle(runId).result();
  expect(output).toBe('migrated');
  const done = await stack.client.runs.get(runId);
  expect(done.status).toBe('COMPLETED');
  expect(await provider.processCount(view.record.sandboxId)).toBe(0);
  // The exec after the restore saw the file written before the suspension.
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  const results = (history.events ?? []).flatMap((e) =>
    (e.activityTaskCompletedEventAttributes?.result?.payloads ?? []).map((p) => Buffer.from(p.data ?? []).toString()),
  );
  expect(results).toContainEqual(expect.stringContaining('"stdout":"step one\\ndone\\n"'));
});

test('deny with onDeny fail ends the Run FAILED and keeps its workspace: no restore, the checkpoint stays', async () => {
  const { runId } = await stack.client.runs.start(spec('fail'));
  const released = await waitForRelease(runId);
  const checkpoints = await checkpointKeys(s3, released.record.sandboxId);
  expect(checkpoints).not.toEqual([]);
  await stack.client.runs.respond(runId, 'int-1', { decision: 'deny', comment: 'not today' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('FAILED');
  expect(snapshot.error).toEqual({ code: 'DENIED', message: 'the interaction was denied' });
  expect(snapshot.interactions[0]).toMatchObject({
    status: 'answered',
    response: { decision: 'deny', comment: 'not today' },
  });
  // Released as it was, with the same checkpoint; the sandbox was never brought back to be failed.
  const after = await stack.client.runs.resource(runId);
  expect(after.record).toMatchObject({ state: 'RELEASED', checkpoint: released.record.checkpoint });
  expect(await checkpointKeys(s3, released.record.sandboxId)).toEqual(checkpoints);
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  const scheduled = (history.events ?? []).flatMap(
    (e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? [],
  );
  expect(scheduled).not.toContain('restoreSandbox');
  expect(scheduled).not.toContain('sandboxOp');
});

test('respond rejections leave no event in history and the Run unchanged', async () => {
  const { runId } = await stack.client.runs.start(spec());
  await waitForRelease(runId);
  const handle = stack.temporal.workflow.getHandle(runId);
  // RELEASED shows in a query while the workflow task that recorded it may still be completing: count once the history is quiet.
  const before = await eventually(
    async () => {
      const first = (await handle.fetchHistory()).events ?? [];
      await new Promise((r) => setTimeout(r, 300));
      const again = (await handle.fetchHistory()).events ?? [];
      const last = again[again.length - 1];
      const taskPending = Boolean(
        last?.workflowTaskScheduledEventAttributes || last?.workflowTaskStartedEventAttributes,
      );
      return first.length === again.length && !taskPending ? again.length : undefined;
    },
    30_000,
    'a quiet history',
  );
  await expect(stack.client.runs.respond(runId, 'int-9', { decision: 'approve' })).rejects.toMatchObject({
    code: 'NOT_FOUND',
    httpStatus: 404,
  });
  await expect(stack.client.runs.respond(runId, 'int-1', { input: 'text' })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    httpStatus: 400,
  });
  await expect(stack.client.runs.respond(runId, 'int-1', { decision: 'maybe' })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
  });
  await expect(stack.client.runs.resume(runId)).rejects.toMatchObject({
    code: 'INVALID_STATE_TRANSITION',
    httpStatus: 409,
  });
  expect((await handle.fetchHistory()).events?.length).toBe(before);
  expect((await stack.client.runs.get(runId)).status).toBe('WAITING');

  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { updateId: 'answer-1' });
  // The identical answer under the same update id is idempotent; anything else is ALREADY_ANSWERED.
  await expect(
    stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { updateId: 'answer-1' }),
  ).resolves.toMatchObject({
    status: 'answered',
  });
  await expect(
    stack.client.runs.respond(runId, 'int-1', { decision: 'deny' }, { updateId: 'answer-2' }),
  ).rejects.toMatchObject({
    code: 'ALREADY_ANSWERED',
    httpStatus: 409,
  });
  await expect(handle.result()).resolves.toBe('migrated');
});

test('a Run takes suspend and resume under their own names, and under the names they had first', async () => {
  const { runId } = await stack.client.runs.start({ agent: { driver: 'external' }, sandbox: { provider: 'local' } });
  const phase = async () => (await stack.client.runs.resource(runId)).phase;
  await eventually(
    async () => (await stack.client.runs.resource(runId)).record.state === 'ACTIVE',
    30_000,
    'the sandbox provisioned',
  );
  const handle = stack.temporal.workflow.getHandle(runId);
  // The names a client built before the rename sends.
  expect(await handle.executeUpdate(legacySuspendRunUpdate)).toMatchObject({ runId });
  expect(await phase()).toBe('SUSPENDED');
  expect(await stack.client.runs.resume(runId)).toMatchObject({ runId });
  expect(await phase()).toBe('ACTIVE');
  expect(await stack.client.runs.suspend(runId)).toMatchObject({ runId });
  expect(await phase()).toBe('SUSPENDED');
  expect(await handle.executeUpdate(legacyResumeRunUpdate)).toMatchObject({ runId });
  expect(await phase()).toBe('ACTIVE');
  // The new names are not a sandbox's: a sandbox workflow does not know them.
  expect(suspendRunUpdate.name).toBe('suspendRun');
  expect(resumeRunUpdate.name).toBe('resumeRun');
  await stack.client.runs.cancel(runId);
});
