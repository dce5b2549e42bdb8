import { WorkflowUpdateStage } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import type { AgentDriver, AgentAction } from '../../drivers/api';
import type { ProviderDeps, SandboxProvider } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { suspendRunUpdate } from '../../workflows/definitions';
import { useStack, startStack, eventually, saw } from '../helpers/stack';
import { parentWithChild, releasedView, startHeld } from '../helpers/runs';
import { checkpointKeys, testS3 } from '../helpers/s3';

// Edges of a Run's lifecycle where a Run hung or lost its workspace.

/** A driver that goes quiet (thinks) before its hold, so policy.idleTimeout freezes the sandbox first. */
const job = (command: string): AgentAction => ({
  type: 'job',
  command,
  pauseBehavior: 'CANCEL',
  executionAffinity: 'SANDBOX',
  background: false,
});
const quietThenHold: AgentDriver = {
  name: 'quiet-then-hold',
  async step({ state, lastResult }) {
    const step = (state as number | undefined) ?? 0;
    if (step === 0) return { action: job('echo before'), state: 1 };
    if (step === 1) {
      await new Promise((r) => setTimeout(r, 3_000));
      return { action: { type: 'hold', reason: 'review' }, state: 2 };
    }
    if (step === 2) return { action: job('echo after'), state: 3 };
    return { action: { type: 'complete', output: lastResult }, state: 4 };
  },
};

/** Opens the gate the `gated` driver's fifth step waits at. */
let openGate: () => void = () => undefined;
const gate = new Promise<void>((resolve) => (openGate = resolve));

/**
 * Holds; after its resume asks; holds again; after that resume thinks until the test opens the
 * gate, then writes a file and completes. Both resumes are deferred to the next action.
 */
const gated: AgentDriver = {
  name: 'gated',
  async step({ state }) {
    const step = (state as number | undefined) ?? 0;
    const next = (action: AgentAction) => ({ action, state: step + 1 });
    if (step === 0) return next({ type: 'writeFile', path: 'a.txt', content: 'a' });
    if (step === 1 || step === 3) return next({ type: 'hold', reason: `hold ${step}` });
    if (step === 2) return next({ type: 'interaction', kind: 'approval', prompt: 'go on?' });
    if (step === 4) {
      await gate;
      return next({ type: 'writeFile', path: 'b.txt', content: 'b' });
    }
    return next({ type: 'complete', output: 'done' });
  },
};

/** The local provider without a snapshot: an isolated workspace cannot be released, so it is RETAINED. */
const noSnapshot = (deps: ProviderDeps): SandboxProvider => {
  const local = createLocalProvider(deps, { name: 'nosnap' });
  return { ...local, capabilities: { ...local.capabilities, pauseModes: ['DETACH'] } };
};

/** Lets a `holdsDestroy` destroy go on; set by the test that holds one. */
let destroyHeld: { started: () => void; go: Promise<void> } | undefined;

/** The local provider whose destroy waits for the test (it heartbeats, and stops if told to). */
const holdsDestroy = (deps: ProviderDeps): SandboxProvider => {
  const local = createLocalProvider(deps, { name: 'holds-destroy' });
  return {
    ...local,
    async destroy(request, context) {
      const held = destroyHeld;
      if (held) {
        held.started();
        let going = false;
        void held.go.then(() => (going = true));
        while (!going) {
          context.signal?.throwIfAborted();
          context.heartbeat?.();
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      return local.destroy(request, context);
    },
  };
};

/** Whether the Run asked for an activity's cancellation (its held destroy is its only one under way). */
const destroyCancelRequested = async (runId: string) =>
  ((await stack.temporal.workflow.getHandle(runId).fetchHistory()).events ?? []).some(
    (e) => e.activityTaskCancelRequestedEventAttributes,
  );

const stack = useStack(() =>
  startStack({ worker: { drivers: [quietThenHold, gated], providers: [noSnapshot, holdsDestroy] } }),
);
const s3 = testS3();

const provider = (name = 'local') => stack.workers.get('host-a')!.registry.get(name);

test('an idle-frozen sandbox that comes back by attach (DETACH hold) is thawed before the next job', async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'quiet-then-hold' },
    sandbox: { provider: 'local' },
    policy: { idleTimeout: '1s' },
  });
  await eventually(
    async () => {
      const view = saw(await stack.client.runs.resource(runId));
      return view.phase === 'SUSPENDED' && view.record.state === 'RELEASED' && view.record.pauseMode === 'DETACH';
    },
    30_000,
    'held with DETACH',
  );
  await stack.client.runs.resume(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'after\n',
  });
});

test('a resume answers once taken, also when the sandbox comes back only with the next action; a suspend is taken while it does', async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'gated' },
    sandbox: { provider: 'local' },
    policy: { pauseMode: 'DETACH' },
  });
  const view = async () => saw(await stack.client.runs.resource(runId));
  const held = async () => {
    const v = await view();
    return v.phase === 'SUSPENDED' && v.suspension?.reason === 'POLICY_HOLD' && v.record.state === 'RELEASED';
  };
  const within = <T>(op: Promise<T>, what: string) =>
    Promise.race([
      op,
      new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} not answered in 60 s`)), 60_000)),
    ]);
  await eventually(held, 30_000, 'first hold');
  // The next action is an ask: the sandbox comes back and goes again within one workflow task.
  await within(stack.client.runs.resume(runId), 'resume into an ask');
  await eventually(async () => saw(await stack.client.runs.get(runId)).status === 'WAITING', 30_000, 'asked');
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await eventually(held, 30_000, 'second hold');
  // The next action waits for the agent: the Run is RESUMING while it thinks.
  expect(await within(stack.client.runs.resume(runId), 'resume into a step')).toMatchObject({ status: 'RUNNING' });
  expect((await view()).phase).toBe('RESUMING');
  await expect(stack.client.runs.resume(runId)).rejects.toMatchObject({ code: 'INVALID_STATE_TRANSITION' });
  // A suspend is taken after the agent's step, as when ACTIVE: the file is written, then the Run suspends.
  // Accepted before the agent's step returns (the order under test, not a race), answered once taken.
  const suspending = await stack.temporal.workflow
    .getHandle(runId)
    .startUpdate(suspendRunUpdate, { waitForStage: WorkflowUpdateStage.ACCEPTED });
  openGate();
  await within(suspending.result(), 'suspend while resuming');
  expect(await view()).toMatchObject({ phase: 'SUSPENDED', suspension: { reason: 'MANUAL' } });
  await within(stack.client.runs.resume(runId), 'resume into completion');
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
});

test('a failed or cancelled Run keeps a RETAINED isolated workspace (no snapshot, so never destroyed)', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ writeFile: { path: 'work.txt', content: 'hours of work' } }, { ask: 'go?' }],
    },
    sandbox: { provider: 'nosnap' },
  });
  const view = await eventually(
    async () => {
      const v = saw(await stack.client.runs.resource(runId));
      return v.phase === 'SUSPENDED' && v.record.state === 'RETAINED' ? v : undefined;
    },
    30_000,
    'RETAINED',
  );
  await stack.client.runs.cancel(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect((await stack.client.runs.get(runId)).status).toBe('CANCELLED');
  const after = await stack.client.runs.resource(runId);
  expect(after.record.state).toBe('RETAINED');
  const content = await provider('nosnap').readFile(
    { sandboxId: view.record.sandboxId, path: 'work.txt' },
    { ownerId: runId, hostId: 'host-a' },
  );
  expect(content.toString()).toBe('hours of work');
});

test('a child that is terminated without its final report settles as such and unblocks its parent', async () => {
  const { parentId, childId, spec } = parentWithChild(
    'parent-term',
    [{ ask: 'never answered' }],
    [{ complete: 'parent done' }],
  );
  await stack.client.runs.start(spec);
  await eventually(async () => saw(await stack.client.runs.get(childId)).status === 'WAITING', 30_000, 'child waiting');
  await stack.temporal.workflow.getHandle(childId).terminate('operator gave up');
  await expect(stack.temporal.workflow.getHandle(parentId).result()).resolves.toBe('parent done');
});

test('retention expiry of a RELEASE_BLOCKED Run does not hang; answers after expiry began are a stale route', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ exec: 'sleep 600', background: true, pauseBehavior: 'CONTINUE' }, { ask: 'anyone?' }],
    },
    sandbox: { provider: 'local' },
    policy: { suspendedRetentionSeconds: 2 },
  });
  await eventually(
    async () => saw(await stack.client.runs.resource(runId)).record.state === 'RELEASE_BLOCKED',
    30_000,
    'RELEASE_BLOCKED',
  );
  await eventually(async () => saw(await stack.client.runs.get(runId)).status === 'EXPIRED', 30_000, 'EXPIRED');
  await expect(stack.client.runs.respond(runId, 'int-1', { decision: 'approve' })).rejects.toMatchObject({
    code: 'STALE_SANDBOX_ROUTE',
    httpStatus: 409,
  });
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot).toMatchObject({ status: 'EXPIRED', error: { code: 'SUSPEND_EXPIRED' } });
  expect(snapshot.interactions[0].status).toBe('expired');
  expect(await provider().processCount(`${runId}-sbx`)).toBe(0);
});

/**
 * Holds the next destroy of the `holds-destroy` provider while `interrupt` starts a completing Run and
 * interrupts it (resolving to its id once the interruption is in the Run's history): the Run asks for no
 * cancellation of the destroy (whether one would reach the activity before the test lets it go depends
 * on its heartbeats), then completes with its sandbox destroyed and no process left.
 */
async function destroyGoesOnThrough(interrupt: (destroying: Promise<void>) => Promise<string>) {
  let go: () => void = () => undefined;
  const destroying = new Promise<void>((started) => {
    destroyHeld = { started, go: new Promise<void>((resolve) => (go = resolve)) };
  });
  let runId: string;
  try {
    runId = await interrupt(destroying);
    await new Promise((r) => setTimeout(r, 2_000));
    expect(await destroyCancelRequested(runId)).toBe(false);
  } finally {
    go();
    destroyHeld = undefined;
  }
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
  expect((await stack.client.runs.get(runId)).status).toBe('COMPLETED');
  const after = saw(await stack.client.runs.resource(runId));
  expect(after.record.state).toBe('DESTROYED');
  expect(await provider('holds-destroy').processCount(after.record.sandboxId)).toBe(0);
  return after;
}

/** Waits for an event `seen` picks out in the Run's history. */
const inHistory = (runId: string, what: string, seen: (e: temporal.api.history.v1.IHistoryEvent) => unknown) =>
  eventually(
    async () => ((await stack.temporal.workflow.getHandle(runId).fetchHistory()).events ?? []).some(seen) || undefined,
    30_000,
    what,
  );

test('a cancel that comes while a completing Run destroys its sandbox does not stop the destroy: COMPLETED, all gone', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ exec: 'echo keep > notes.txt' }, { ask: 'go?' }, { exec: 'cat notes.txt' }, { complete: 'done' }],
    },
    sandbox: { provider: 'holds-destroy' },
  });
  const released = await releasedView(stack.client, runId, 60_000);
  expect(await checkpointKeys(s3, released.record.sandboxId)).not.toEqual([]);
  await destroyGoesOnThrough(async (destroying) => {
    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    await destroying;
    await stack.client.runs.cancel(runId);
    await inHistory(runId, 'cancel requested', (e) => e.workflowExecutionCancelRequestedEventAttributes);
    return runId;
  });
  expect(await checkpointKeys(s3, released.record.sandboxId)).toEqual([]);
});

test('a Run cancelled on a hold (DETACH, compute left running) releases its compute and keeps its workspace in a checkpoint', async () => {
  const { runId, held } = await startHeld(stack.client);
  expect(held.record.pauseMode).toBe('DETACH');
  expect(await provider().processCount(held.record.sandboxId)).toBeGreaterThan(0);
  await stack.client.runs.cancel(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect((await stack.client.runs.get(runId)).status).toBe('CANCELLED');
  const after = saw(await stack.client.runs.resource(runId));
  expect(after.record).toMatchObject({ state: 'RELEASED', pauseMode: 'SNAPSHOT_AND_TERMINATE' });
  expect(after.record.fence).toBeGreaterThan(held.record.fence);
  expect(await provider().processCount(held.record.sandboxId)).toBe(0);
  expect(await checkpointKeys(s3, held.record.sandboxId)).not.toEqual([]);
});

test('a Run its agent fails with its sandbox active keeps the workspace in a checkpoint and releases its compute', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        { writeFile: { path: 'work.txt', content: 'hours of work' } },
        { expectFile: { path: 'work.txt', content: 'something else' } },
      ],
    },
    sandbox: { provider: 'local' },
  });
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect(await stack.client.runs.get(runId)).toMatchObject({
    status: 'FAILED',
    error: { code: 'EXPECT_FILE_MISMATCH' },
  });
  const after = saw(await stack.client.runs.resource(runId));
  expect(after.record).toMatchObject({ state: 'RELEASED', pauseMode: 'SNAPSHOT_AND_TERMINATE' });
  expect(await provider().processCount(after.record.sandboxId)).toBe(0);
  expect(await checkpointKeys(s3, after.record.sandboxId)).not.toEqual([]);
});

test('a child that ended keeping its compute (no snapshot) blocks neither its parent’s release nor its completion', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        {
          spawn: {
            agent: { driver: 'scripted', steps: [{ exec: 'sleep 120' }, { complete: 'child done' }] },
            sandbox: { provider: 'nosnap' },
          },
        },
        { ask: 'go on?' },
        { complete: 'parent done' },
      ],
    },
    sandbox: { provider: 'local' },
  });
  const childId = `${runId}.child-1`;
  await eventually(
    async () => (await stack.client.runs.resource(runId)).record.state === 'RELEASE_BLOCKED',
    60_000,
    'parent blocked by its child',
  );
  await stack.client.runs.cancel(childId);
  await expect(stack.temporal.workflow.getHandle(childId).result()).rejects.toThrow();
  expect((await stack.client.runs.get(childId)).status).toBe('CANCELLED');
  // Its workspace cannot be snapshotted: the cancelled child keeps its sandbox, for good.
  expect((await stack.client.runs.resource(childId)).record.state).toBe('ACTIVE');
  await eventually(
    async () => (await stack.client.runs.resource(runId)).record.state === 'RELEASED',
    30_000,
    'parent released',
  );
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  const ended = await Promise.race([
    stack.temporal.workflow.getHandle(runId).result(),
    new Promise((resolve) => setTimeout(() => resolve('still waiting for its child'), 30_000)),
  ]);
  expect(ended).toBe('parent done');
});

test('a ttl that runs out while a completing Run destroys its sandbox does not stop the destroy either', async () => {
  await destroyGoesOnThrough(async (destroying) => {
    const { runId } = await stack.client.runs.start({
      agent: { driver: 'scripted', steps: [{ exec: 'echo work > notes.txt' }, { complete: 'done' }] },
      sandbox: { provider: 'holds-destroy' },
      policy: { ttl: '5s' },
    });
    await destroying;
    // The ttl's timer fires while the destroy is held.
    await inHistory(runId, 'ttl fired', (e) => e.timerFiredEventAttributes);
    return runId;
  });
});
