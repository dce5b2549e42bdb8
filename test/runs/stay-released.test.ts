import type { PauseMode, ResourceView, RunPolicy, StepShape } from '../../common/schemas';
import { leftOn } from '../helpers/hosts';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';
import { eventually, saw, startStack, useStack } from '../helpers/stack';

// An answered or resumed Run whose next action is another ask or a hold that would release its
// sandbox as it is already released skips the round trip (PATCH_STAY_RELEASED): no restore and no
// release until an action needs the sandbox, the same checkpoint all along, and the workspace the
// agent wrote before its first ask is there for the exec at the end.

const s3 = testS3();
const stack = useStack(() => startStack({ hostId: 'host-a' }));

const RESTORES = ['restoreSandbox', 'resumeAndExecInSandbox'];

/** The activity types the Run has scheduled so far, in order. */
async function scheduled(runId: string): Promise<string[]> {
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  return (history.events ?? []).flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
}
const count = (names: string[], name: string) => names.filter((n) => n === name).length;

/** Waits until the Run is suspended for `reason` (with `pending` the interaction waiting, if any) and its sandbox released. */
async function suspendedFor(runId: string, reason: string, pending?: string): Promise<ResourceView> {
  return eventually(
    async () => {
      const snapshot = saw(await stack.client.runs.get(runId));
      const view = saw(await stack.client.runs.resource(runId));
      const waiting = snapshot.interactions.filter((i) => i.status === 'pending').map((i) => i.id);
      const ok =
        view.phase === 'SUSPENDED' &&
        view.suspension?.reason === reason &&
        view.record.state === 'RELEASED' &&
        waiting.join() === (pending ?? '');
      return ok ? view : undefined;
    },
    90_000,
    `${runId} suspended for ${reason}${pending ? ` (${pending})` : ''} and released`,
  );
}

function start(steps: StepShape[], policy: RunPolicy = {}) {
  return stack.client.runs.start({ agent: { driver: 'scripted', steps }, sandbox: { provider: 'local' }, policy });
}

const script: StepShape[] = [
  { writeFile: { path: 'notes.txt', content: 'written before the first ask' } },
  { ask: 'first?' },
  { ask: 'second?' },
  { hold: 'wait for a person' },
  { exec: 'cat notes.txt' },
];

test.each<PauseMode>(['SNAPSHOT_AND_TERMINATE', 'DETACH'])(
  'ask, ask, hold, exec in %s: the sandbox stays released from the first ask to the exec, which brings it back with the workspace',
  async (pauseMode) => {
    const { runId } = await start(script, { pauseMode });
    const first = await suspendedFor(runId, 'INTERACTION', 'int-1');
    const sandboxId = first.record.sandboxId;
    expect(first.record.pauseMode).toBe(pauseMode);
    if (pauseMode === 'SNAPSHOT_AND_TERMINATE') expect(first.record.checkpoint).toBeDefined();
    const keys = await storedKeys(s3, sandboxId);
    expect(count(await scheduled(runId), 'releaseSandbox')).toBe(1);
    // Released: nothing of a snapshotted sandbox runs on the host (a detached one is left as it was).
    const onHost = await leftOn(stack, 'host-a', sandboxId);
    if (pauseMode === 'SNAPSHOT_AND_TERMINATE') expect(onHost.processes).toBe(0);

    // Each answer or resume goes straight into the next suspension: the record is released as it was.
    const same = (view: ResourceView, raisedBy: number) => {
      expect(view.record).toMatchObject({ state: 'RELEASED', pauseMode, fence: first.record.fence + raisedBy });
      expect(view.record.checkpoint).toEqual(first.record.checkpoint);
      expect(view.record.releasedAt).toBe(first.record.releasedAt);
    };
    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    const second = await suspendedFor(runId, 'INTERACTION', 'int-2');
    same(second, 1);
    // Its own suspension: since and expiry from now, the hashes of the Run.
    expect(second.suspension!.since > first.suspension!.since).toBe(true);
    expect(second.suspension!.expiresAt! > first.suspension!.expiresAt!).toBe(true);
    expect(second.suspension).toMatchObject({ interactionIds: ['int-2'], pauseMode, hashes: first.suspension!.hashes });

    await stack.client.runs.respond(runId, 'int-2', { decision: 'approve' });
    const held = await suspendedFor(runId, 'POLICY_HOLD');
    same(held, 2);
    const meanwhile = await scheduled(runId);
    expect(count(meanwhile, 'releaseSandbox')).toBe(1);
    expect(meanwhile.filter((n) => RESTORES.includes(n))).toEqual([]);
    expect(meanwhile.filter((n) => n === 'sandboxOp')).toEqual([]); // no attach either
    expect(await storedKeys(s3, sandboxId)).toEqual(keys);
    expect(await leftOn(stack, 'host-a', sandboxId)).toEqual(onHost);

    // The exec brings the sandbox back with it (one activity), on the workspace written before the first ask.
    await stack.client.runs.resume(runId);
    const result = (await stack.temporal.workflow.getHandle(runId).result()) as { exitCode: number; stdout: string };
    expect(result).toMatchObject({ exitCode: 0, stdout: 'written before the first ask' });
    const all = await scheduled(runId);
    expect(count(all, 'releaseSandbox')).toBe(1);
    expect(count(all, 'resumeAndExecInSandbox')).toBe(1);
    expect(count(all, 'restoreSandbox')).toBe(0);
    expect(count(all, 'execInSandbox')).toBe(0);
    const end = saw(await stack.client.runs.resource(runId));
    expect(end.record.state).toBe('DESTROYED');
    expect(await storedKeys(s3, sandboxId)).toEqual([]);
  },
  240_000,
);

test('a hold whose pause mode differs from the release it follows brings the sandbox back and releases it anew', async () => {
  // No policy mode: an ask snapshots an isolated workspace, a hold detaches it.
  const { runId } = await start(script);
  const first = await suspendedFor(runId, 'INTERACTION', 'int-1');
  expect(first.record.pauseMode).toBe('SNAPSHOT_AND_TERMINATE');
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  const second = await suspendedFor(runId, 'INTERACTION', 'int-2');
  // The second ask is the same mode: skipped.
  expect(second.record).toMatchObject({ pauseMode: 'SNAPSHOT_AND_TERMINATE', checkpoint: first.record.checkpoint });
  expect((await scheduled(runId)).filter((n) => n === 'releaseSandbox' || RESTORES.includes(n))).toEqual([
    'releaseSandbox',
  ]);
  await stack.client.runs.respond(runId, 'int-2', { decision: 'approve' });
  const held = await suspendedFor(runId, 'POLICY_HOLD');
  expect(held.record.pauseMode).toBe('DETACH');
  // The hold took today's path: restored from the snapshot, then detached.
  expect((await scheduled(runId)).filter((n) => n === 'releaseSandbox' || RESTORES.includes(n))).toEqual([
    'releaseSandbox',
    'restoreSandbox',
    'releaseSandbox',
  ]);
  await stack.client.runs.resume(runId);
  const result = (await stack.temporal.workflow.getHandle(runId).result()) as { exitCode: number; stdout: string };
  expect(result).toMatchObject({ exitCode: 0, stdout: 'written before the first ask' });
}, 240_000);

test('a Run cancelled in a skipped suspension keeps its checkpoint and runs nothing, as in any suspension', async () => {
  const { runId } = await start(script.slice(0, 3), { pauseMode: 'SNAPSHOT_AND_TERMINATE' });
  const first = await suspendedFor(runId, 'INTERACTION', 'int-1');
  const sandboxId = first.record.sandboxId;
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await suspendedFor(runId, 'INTERACTION', 'int-2');
  const keys = await checkpointKeys(s3, sandboxId);
  expect(keys).toHaveLength(1);
  await stack.client.runs.cancel(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('CANCELLED');
  expect(snapshot.interactions.map((i) => i.status)).toEqual(['answered', 'cancelled']);
  const after = saw(await stack.client.runs.resource(runId));
  expect(after.record).toMatchObject({ state: 'RELEASED', checkpoint: first.record.checkpoint });
  expect(await checkpointKeys(s3, sandboxId)).toEqual(keys);
  expect(count(await scheduled(runId), 'releaseSandbox')).toBe(1);
  expect(count(await scheduled(runId), 'restoreSandbox')).toBe(0);
  expect(await leftOn(stack, 'host-a', sandboxId)).toMatchObject({ processes: 0 });
}, 180_000);

test('retention expiry of a skipped suspension keeps nothing: no checkpoint, no compute', async () => {
  const { runId } = await start(script.slice(0, 3), {
    pauseMode: 'SNAPSHOT_AND_TERMINATE',
    suspendedRetentionSeconds: 25,
  });
  const first = await suspendedFor(runId, 'INTERACTION', 'int-1');
  const sandboxId = first.record.sandboxId;
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  const second = await suspendedFor(runId, 'INTERACTION', 'int-2');
  expect(second.record.checkpoint).toEqual(first.record.checkpoint);
  // The second suspension expires on its own clock, after the first one's deadline.
  expect(second.suspension!.expiresAt! > first.suspension!.expiresAt!).toBe(true);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot).toMatchObject({ status: 'EXPIRED', error: { code: 'SUSPEND_EXPIRED' } });
  expect(snapshot.interactions.map((i) => i.status)).toEqual(['answered', 'expired']);
  // Not at the first suspension's deadline: the Run closed no earlier than its own.
  const closed = (await stack.temporal.workflow.getHandle(runId).describe()).closeTime!;
  expect(closed.getTime()).toBeGreaterThanOrEqual(Date.parse(second.suspension!.expiresAt!));
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  expect(await leftOn(stack, 'host-a', sandboxId)).toEqual({ directory: false, processes: 0 });
  expect(count(await scheduled(runId), 'restoreSandbox')).toBe(0);
}, 180_000);
