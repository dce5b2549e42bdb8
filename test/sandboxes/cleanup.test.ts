import { StasisClient } from '../../client';
import { backAndMaintained, leftOn } from '../helpers/hosts';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';
import { useStack, startStack, eventually } from '../helpers/stack';
import { sandboxWorkflowId } from '../../workflows/definitions';

// A sandbox's end cleans up everything, or hands what it could not clean to its host.

const s3 = testS3();
const stack = useStack(() => startStack({ hostId: 'host-a' }));

test('destroy deletes every checkpoint the sandbox ever had, not only the latest', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.suspend(sandboxId);
  await stack.client.sandboxes.resume(sandboxId);
  await stack.client.sandboxes.exec(sandboxId, { command: 'echo changed > f' });
  await stack.client.sandboxes.suspend(sandboxId);
  expect(await checkpointKeys(s3, sandboxId)).toHaveLength(2);
  await stack.client.sandboxes.destroy(sandboxId);
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  // The host's destroy deleted them and said so: the workflow sent no second delete.
  expect(await deletesScheduled(sandboxId)).toEqual([]);
});

/**
 * The workflow's own deletes of the sandbox's checkpoints, by their timeouts: a worker lost mid-delete
 * is noticed by its missed heartbeats, not at the end of a long start-to-close.
 */
async function deletesScheduled(sandboxId: string): Promise<{ heartbeat: number; startToClose: number }[]> {
  const history = await stack.temporal.workflow.getHandle(sandboxWorkflowId(sandboxId)).fetchHistory();
  return (history.events ?? [])
    .filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'deleteSandboxCheckpoints')
    .map((e) => ({
      heartbeat: Number(e.activityTaskScheduledEventAttributes?.heartbeatTimeout?.seconds),
      startToClose: Number(e.activityTaskScheduledEventAttributes?.startToCloseTimeout?.seconds),
    }));
}

test('retention expiry deletes every checkpoint the sandbox ever had, not only the latest', async () => {
  const expiring = new StasisClient(stack.temporal, {
    taskQueue: stack.config.STASIS_TASK_QUEUE,
    suspendedRetentionSeconds: 4,
  });
  const { sandboxId } = await expiring.sandboxes.create({ provider: 'local' });
  await expiring.sandboxes.start(sandboxId);
  await expiring.sandboxes.suspend(sandboxId);
  await expiring.sandboxes.resume(sandboxId);
  await expiring.sandboxes.exec(sandboxId, { command: 'echo changed > f' });
  await expiring.sandboxes.suspend(sandboxId);
  expect(await checkpointKeys(s3, sandboxId)).toHaveLength(2);
  await eventually(
    async () => (await expiring.sandboxes.get(sandboxId)).error?.code === 'SUSPEND_EXPIRED',
    30_000,
    'expired',
  );
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  await expiring.sandboxes.destroy(sandboxId);
});

test('destroy while the host is gone ends promptly; the host removes the sandbox when it is back', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.suspend(sandboxId);
  await stack.client.sandboxes.resume(sandboxId);
  await stack.client.sandboxes.suspend(sandboxId);
  await stack.client.sandboxes.resume(sandboxId);
  expect(await checkpointKeys(s3, sandboxId)).toHaveLength(2);
  // Host A's worker goes away (its sandbox's processes keep running); B serves the shared queue.
  await stack.startWorker('host-b');
  await stack.stopWorker('host-a');
  const destroyed = await stack.client.sandboxes.destroy(sandboxId);
  expect(destroyed.state).toBe('destroyed');
  expect(destroyed.record).toMatchObject({
    state: 'DESTROYED',
    lastError: expect.stringMatching(/host host-a did not finish.*that host's maintenance removes/),
  });
  const handle = stack.temporal.workflow.getHandle(`sandbox-${sandboxId}`);
  await eventually(async () => (await handle.describe()).status.name === 'COMPLETED', 30_000, 'sandbox workflow ended');
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  // The host said nothing (it was gone): the workflow deleted them, from host B.
  expect(await deletesScheduled(sandboxId)).toEqual([{ heartbeat: 30, startToClose: 3600 }]);
  // Not removed yet: nothing ran on host A.
  const left = await leftOn(stack, 'host-a', sandboxId);
  expect(left.directory).toBe(true);
  expect(left.processes).toBeGreaterThan(0);

  // Host A is back: its maintenance removes what the destroy could not.
  expect(await backAndMaintained(stack, 'host-a')).toEqual([sandboxId]);
  expect(await leftOn(stack, 'host-a', sandboxId)).toEqual({ directory: false, processes: 0 });
  await stack.stopWorker('host-b');
}, 180_000);

test('destroy while a command runs leaves nothing of the sandbox on its host, also once the command has ended', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  const exec = stack.client.sandboxes.exec(sandboxId, { command: 'sleep 30' }).catch((err: unknown) => err);
  await eventually(async () => (await leftOn(stack, 'host-a', sandboxId)).processes > 1, 20_000, 'command running');
  expect(await stack.client.sandboxes.destroy(sandboxId)).toMatchObject({ state: 'destroyed' });
  await exec;
  // The killed command's end was recorded after the destroy: its job journal (with its output) brought
  // back the sandbox's directory, which no maintenance pass removed.
  expect(await leftOn(stack, 'host-a', sandboxId)).toEqual({ directory: false, processes: 0 });
}, 120_000);
