import { useStack, startStack, eventually, saw } from '../helpers/stack';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { storedKeys, testS3 } from '../helpers/s3';

const faults: ReleaseFaults = { calls: [] };
const s3 = testS3();
const stack = useStack(() => startStack({ worker: { providers: [faultyProvider(faults)] } }));
beforeEach(() => {
  faults.release = undefined;
  faults.calls.length = 0;
});

const spec = {
  agent: {
    driver: 'scripted',
    steps: [
      { writeFile: { path: 'a.txt', content: 'kept' } },
      { ask: 'go?' },
      { expectFile: { path: 'a.txt', content: 'kept' } },
    ],
  },
  sandbox: { provider: 'faulty' },
};

test.each(['throw', 'not-released'] as const)(
  'a failing release (%s) is retried with backoff while the Run stays SUSPENDED and its interaction pending; an answer cancels it and re-attaches',
  async (fault) => {
    faults.release = fault;
    const { runId } = await stack.client.runs.start(spec);
    const retrying = await eventually(
      async () => {
        const view = saw(await stack.client.runs.resource(runId));
        return view.record.attempts >= 3 ? view : undefined;
      },
      30_000,
      'three release attempts',
    );
    expect(retrying.phase).toBe('SUSPENDED');
    expect(retrying.record.state).toBe('RELEASING');
    expect(retrying.record.lastError).toMatch(fault === 'throw' ? /injected release failure/ : /computeReleased=false/);
    const snapshot = await stack.client.runs.get(runId);
    expect(snapshot.status).toBe('WAITING');
    expect(snapshot.interactions[0].status).toBe('pending');
    // Temporal's own pending activity shows the same attempts.
    const description = await stack.temporal.workflow.getHandle(runId).describe();
    const pending = description.raw.pendingActivities?.find((a) => a.activityType?.name === 'releaseSandbox');
    expect(pending?.attempt).toBeGreaterThanOrEqual(3);
    // Backoff: 1 s, 2 s, 4 s... between attempts (Temporal's retry, observed).
    const sandboxId = retrying.record.sandboxId;
    const provider = stack.workers.get('host-a')!.registry.get('faulty');
    expect(await provider.processCount(sandboxId)).toBeGreaterThan(0);

    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({
      path: 'a.txt',
      content: 'kept',
    });
    // The sandbox was re-attached under a higher fence, never released or snapshotted.
    expect(faults.calls.every((c) => c.fence === 1 && c.outcome !== 'released')).toBe(true);
    expect(await storedKeys(s3, sandboxId)).toEqual([]);
    expect(await provider.processCount(sandboxId)).toBe(0);

    // A late release carrying the old fence is refused.
    faults.release = undefined;
    await expect(
      provider.release(
        { sandboxId, idempotencyKey: `${runId}/${sandboxId}/1/release`, mode: 'TERMINATE', fence: 1, reason: 'late' },
        { ownerId: runId, hostId: 'host-a' },
      ),
    ).rejects.toMatchObject({ code: expect.stringMatching(/STALE_FENCE|NOT_FOUND/) });
  },
);

test('a hanging release is cut by its heartbeat timeout and retried, then cancelled by the answer', async () => {
  faults.release = 'hang';
  const { runId } = await stack.client.runs.start(spec);
  await eventually(async () => faults.calls.length >= 2, 90_000, 'a second attempt after the heartbeat timeout');
  const view = await stack.client.runs.resource(runId);
  expect(view.record.state).toBe('RELEASING');
  expect(view.record.lastError).toMatch(/heartbeat|timeout/i);
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({ path: 'a.txt', content: 'kept' });
}, 180_000);

test('the answer wins over a release that later succeeds: a late receipt never touches the restored sandbox', async () => {
  faults.release = 'throw';
  const { runId } = await stack.client.runs.start(spec);
  await eventually(async () => faults.calls.length >= 2, 30_000, 'two attempts');
  faults.release = undefined;
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({ path: 'a.txt', content: 'kept' });
  const releasedAfterAnswer = faults.calls.filter((c) => c.outcome === 'released');
  // Either the release won the race before the answer (then the Run restored from it), or it was cancelled.
  expect(releasedAfterAnswer.length).toBeLessThanOrEqual(1);
});
