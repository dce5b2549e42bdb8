import { WorkflowUpdateStage } from '@temporalio/client';
import type { AgentAction, AgentDriver } from '../../drivers/api';
import { suspendRunUpdate } from '../../workflows/definitions';
import { eventually, saw, startStack, useStack } from '../helpers/stack';

// The most fragile ordering of a deferred resume: a suspend admitted while the agent thinks
// (RESUMING, PATCH_RESUME_TAKEN) whose step then asks, and the ask keeps the sandbox released
// (PATCH_STAY_RELEASED). The suspend is taken by the ask's suspension, as when ACTIVE: its Update
// answers, nothing is restored or released, and the answer brings the workspace back for the job.

/** Opens the gate the driver's third step waits at. */
let openGate: () => void = () => undefined;
const gate = new Promise<void>((resolve) => (openGate = resolve));

const askTwice: AgentDriver = {
  name: 'ask-twice',
  async step({ state, lastResult }) {
    const step = (state as number | undefined) ?? 0;
    const next = (action: AgentAction) => ({ action, state: step + 1 });
    if (step === 0) return next({ type: 'writeFile', path: 'a.txt', content: 'kept' });
    if (step === 1) return next({ type: 'interaction', kind: 'approval', prompt: 'first?' });
    if (step === 2) {
      await gate;
      return next({ type: 'interaction', kind: 'approval', prompt: 'second?' });
    }
    if (step === 3)
      return next({
        type: 'job',
        command: 'cat a.txt',
        pauseBehavior: 'CANCEL',
        executionAffinity: 'SANDBOX',
        background: false,
      });
    return next({ type: 'complete', output: lastResult });
  },
};

const stack = useStack(() => startStack({ worker: { drivers: [askTwice] } }));

async function scheduled(runId: string): Promise<string[]> {
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  return (history.events ?? []).flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
}

test('a suspend taken while a deferred resume waits for the agent, whose step asks: the ask keeps the sandbox released', async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'ask-twice' },
    sandbox: { provider: 'local' },
    policy: { pauseMode: 'SNAPSHOT_AND_TERMINATE' },
  });
  const view = async () => saw(await stack.client.runs.resource(runId));
  const first = await eventually(
    async () => {
      const v = await view();
      return v.phase === 'SUSPENDED' && v.record.state === 'RELEASED' ? v : undefined;
    },
    90_000,
    'first ask released',
  );
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await eventually(async () => (await view()).phase === 'RESUMING', 30_000, 'resume deferred');
  // Admitted (accepted) before the agent's step returns: the order under test, not a race.
  const suspending = await stack.temporal.workflow
    .getHandle(runId)
    .startUpdate(suspendRunUpdate, { waitForStage: WorkflowUpdateStage.ACCEPTED });
  openGate();
  const suspended = suspending.result();
  // Answered by the ask's suspension: the manual one is folded into it, as for an ACTIVE Run.
  expect(await suspended).toMatchObject({ status: 'WAITING' });
  const second = await view();
  expect(second).toMatchObject({
    phase: 'SUSPENDED',
    suspension: { reason: 'INTERACTION', interactionIds: ['int-2'] },
  });
  expect(second.record).toMatchObject({ state: 'RELEASED', fence: first.record.fence + 1 });
  expect(second.record.checkpoint).toEqual(first.record.checkpoint);
  const names = await scheduled(runId);
  expect(names.filter((n) => n === 'releaseSandbox')).toHaveLength(1);
  expect(names.filter((n) => n === 'restoreSandbox' || n === 'resumeAndExecInSandbox')).toHaveLength(0);
  await stack.client.runs.respond(runId, 'int-2', { decision: 'approve' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'kept',
  });
});

test('a suspend while a resume rides with a sandbox job is admitted, as for a job of an ACTIVE Run, and taken once the job is done', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        { writeFile: { path: 'b.txt', content: 'kept' } },
        { ask: 'go on?' },
        { exec: 'sleep 3; cat b.txt' },
        { complete: 'done' },
      ],
    },
    sandbox: { provider: 'local' },
    policy: { pauseMode: 'SNAPSHOT_AND_TERMINATE' },
  });
  const view = async () => saw(await stack.client.runs.resource(runId));
  await eventually(async () => (await view()).record.state === 'RELEASED', 90_000, 'released for the ask');
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await eventually(async () => (await view()).phase === 'RESUMING', 30_000, 'resuming with the job');
  // Refused before (the Run is RESUMING for as long as the job runs); now taken after the job.
  expect(await stack.client.runs.suspend(runId)).toMatchObject({ status: 'RUNNING' });
  expect(await view()).toMatchObject({ phase: 'SUSPENDED', suspension: { reason: 'MANUAL' } });
  const names = await scheduled(runId);
  expect(names.filter((n) => n === 'resumeAndExecInSandbox')).toHaveLength(1);
  expect(names).not.toContain('execInSandbox');
  await stack.client.runs.resume(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
});
