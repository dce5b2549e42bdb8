import type { ProviderDeps, RequestContext, SandboxProvider } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { releasedView } from '../helpers/runs';
import { checkpointKeys, testS3 } from '../helpers/s3';
import { useStack, startStack, saw } from '../helpers/stack';

// A Run cancelled while its sandbox is being brought back or provisioned: the Run's end settles the
// sandbox all the same (no record left RESTORING or PROVISIONING, no process left running).

/** What the `slow` provider stalls next: one call, before or after the real work, until cancelled. */
let stall: { call: 'restore' | 'start'; when: 'before' | 'after' } | undefined;
let stalling = false;

/** Waits (heartbeating) until the activity is cancelled, or a minute. */
async function stallHere(context: RequestContext): Promise<void> {
  stalling = true;
  for (let i = 0; i < 600; i++) {
    context.signal?.throwIfAborted();
    context.heartbeat?.();
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Takes the armed stall if it is for `call` at `when` (only once: a later call goes through). */
function takeStall(call: 'restore' | 'start', when: 'before' | 'after'): boolean {
  if (stall?.call !== call || stall.when !== when) return false;
  stall = undefined;
  return true;
}

/** The local provider whose restore or start stalls once, as a slow download or image start would. */
const slow = (deps: ProviderDeps): SandboxProvider => {
  const local = createLocalProvider(deps, { name: 'slow' });
  return {
    ...local,
    async restore(request, context) {
      if (takeStall('restore', 'before')) await stallHere(context);
      const result = await local.restore(request, context);
      if (takeStall('restore', 'after')) await stallHere(context);
      return result;
    },
    async start(request, context) {
      await local.start(request, context);
      if (takeStall('start', 'after')) await stallHere(context);
    },
  };
};

const s3 = testS3();
const stack = useStack(() => startStack({ hostId: 'host-a', worker: { providers: [slow] } }));
const provider = () => stack.workers.get('host-a')!.registry.get('slow');

async function untilStalling(): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!stalling) {
    if (Date.now() > deadline) throw new Error('the provider call never started');
    await new Promise((r) => setTimeout(r, 100));
  }
  // Past the first heartbeat: the cancel reaches an activity that is well under way.
  await new Promise((r) => setTimeout(r, 1_500));
}

/** Cancels the Run and waits for its end; the Run's status, its record and the sandbox's processes. */
async function cancelAndSettle(runId: string) {
  await stack.client.runs.cancel(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const { record } = saw(await stack.client.runs.resource(runId));
  return {
    status: (await stack.client.runs.get(runId)).status,
    record,
    processes: await provider().processCount(record.sandboxId),
  };
}

// The answered Run's next action: a file write brings the sandbox back first; a job comes back with it (fused).
describe.each([
  ['before', 'writeFile'],
  ['after', 'writeFile'],
  ['after', 'exec'],
] as const)('a Run cancelled while its restore stalls %s restoring (next action: %s)', (when, next) => {
  test('ends CANCELLED with its record RELEASED, its workspace checkpointed and no process left', async () => {
    stalling = false;
    const { runId } = await stack.client.runs.start({
      agent: {
        driver: 'scripted',
        steps: [
          { exec: 'echo hours of work > notes.txt' },
          { ask: 'go on?' },
          next === 'exec' ? { exec: 'echo later > later.txt' } : { writeFile: { path: 'later.txt', content: 'later' } },
          { complete: 'done' },
        ],
      },
      sandbox: { provider: 'slow' },
    });
    const released = await releasedView(stack.client, runId, 60_000);
    stall = { call: 'restore', when };
    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    await untilStalling();

    const end = await cancelAndSettle(runId);
    expect(end.status).toBe('CANCELLED');
    expect(end.record).toMatchObject({ state: 'RELEASED', pauseMode: 'SNAPSHOT_AND_TERMINATE' });
    expect(end.record.lastError).toBeUndefined();
    // Released under a fence of its own, above the one the cut-short restore raised.
    expect(end.record.fence).toBeGreaterThan(released.record.fence + 1);
    expect(end.processes).toBe(0);

    // The cancelled Run kept its workspace: the record's checkpoint is stored and holds the agent's work.
    const checkpoint = end.record.checkpoint!;
    const keys = await checkpointKeys(s3, end.record.sandboxId);
    expect(keys.some((key) => checkpoint.uri.endsWith(key))).toBe(true);
    const ctx = { ownerId: runId, hostId: 'host-a' };
    const sandboxId = end.record.sandboxId;
    await provider().restore({ sandboxId, fence: end.record.fence + 1, checkpoint }, ctx);
    try {
      const notes = await provider().readFile({ sandboxId, path: 'notes.txt' }, ctx);
      expect(notes.toString()).toBe('hours of work\n');
    } finally {
      await provider().destroy({ sandboxId, fence: end.record.fence + 1 }, ctx);
    }
  });
});

/** Starts a Run whose provisioning stalls once the sandbox's processes run, as a provision that starts them and then waits would. */
async function startStalledInProvisioning(): Promise<string> {
  stalling = false;
  stall = { call: 'start', when: 'after' };
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ exec: 'echo hi' }, { complete: 'done' }] },
    sandbox: { provider: 'slow' },
  });
  await untilStalling();
  return runId;
}

test('a Run cancelled while its sandbox is provisioned ends CANCELLED with the sandbox destroyed, no process left', async () => {
  const runId = await startStalledInProvisioning();
  const { record } = saw(await stack.client.runs.resource(runId));
  expect(record.state).toBe('PROVISIONING');
  expect(await provider().processCount(record.sandboxId)).toBeGreaterThan(0);

  const end = await cancelAndSettle(runId);
  expect(end.status).toBe('CANCELLED');
  // No agent step ran in it, so there was no workspace to keep.
  expect(end.record.state).toBe('DESTROYED');
  expect(end.record.lastError).toBeUndefined();
  expect(end.processes).toBe(0);
  expect(await checkpointKeys(s3, end.record.sandboxId)).toEqual([]);
});

test('a suspend waiting on a provisioning Run that is cancelled meanwhile is 409 INVALID_STATE_TRANSITION, not INTERNAL', async () => {
  const runId = await startStalledInProvisioning();
  // The suspend's handler waits for the provisioning to settle; the cancel ends the Run under it.
  const suspend = stack.client.runs.suspend(runId).catch((err: unknown) => err);
  await new Promise((r) => setTimeout(r, 500));
  const end = await cancelAndSettle(runId);
  expect(end.status).toBe('CANCELLED');
  expect(await suspend).toMatchObject({
    code: 'INVALID_STATE_TRANSITION',
    httpStatus: 409,
    message: `run ${runId} was cancelled while it took this request`,
  });
});
