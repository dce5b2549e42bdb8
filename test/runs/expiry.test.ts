import { backAndMaintained, leftOn } from '../helpers/hosts';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';
import { useStack, eventually, saw, startStack } from '../helpers/stack';

// A Run's retention expiry keeps nothing: no checkpoint of any fence, no compute, and it
// never waits for a host that is gone.

const faults: ReleaseFaults = { calls: [] };
const s3 = testS3();
const stack = useStack(() => startStack({ hostId: 'host-a', worker: { providers: [faultyProvider(faults)] } }));
beforeEach(() => {
  faults.release = undefined;
  faults.putPlan = undefined;
});

const uploadedAndHeld = (sandboxId: string) =>
  eventually(
    async () => faults.putCalls?.some((c) => c.sandboxId === sandboxId && c.outcome === 'uploaded, answer held'),
    60_000,
    'a checkpoint uploaded whose answer is held',
  );

test.each([
  ['retention', { suspendedRetentionSeconds: 20 }, 'SUSPEND_EXPIRED'],
  ['ttl', { ttl: '40s' }, 'TTL_EXPIRED'],
] as const)(
  '%s expiry deletes every checkpoint of the sandbox, also one left by a release cancelled after its upload',
  async (_kind, policy, code) => {
    faults.putPlan = (_sandboxId, attempt) => (attempt === 1 ? 'hang-after-upload' : undefined);
    const { runId } = await stack.client.runs.start({
      agent: {
        driver: 'scripted',
        steps: [{ writeFile: { path: 'a.txt', content: 'work' } }, { ask: 'first?' }, { ask: 'second?' }],
      },
      sandbox: { provider: 'faulty' },
      policy,
    });
    const sandboxId = `${runId}-sbx`;
    await uploadedAndHeld(sandboxId);
    // The answer cancels the release: its checkpoint is in the store, but nothing records it.
    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    await eventually(
      async () => {
        const view = saw(await stack.client.runs.resource(runId));
        return view.record.state === 'RELEASED' && view.record.checkpoint !== undefined && view.record.fence > 1;
      },
      60_000,
      'the second suspension released with its checkpoint',
    );
    // The second checkpoint, and the packs and manifest segments it names (the cancelled release put the
    // same content-addressed pack first, so it is among them).
    expect(await checkpointKeys(s3, sandboxId)).toHaveLength(1);
    expect((await storedKeys(s3, sandboxId)).filter((key) => key.includes('/packs/')).length).toBeGreaterThan(0);

    await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
    expect(await stack.client.runs.get(runId)).toMatchObject({ status: 'EXPIRED', error: { code } });
    expect(await storedKeys(s3, sandboxId)).toEqual([]);
  },
  180_000,
);

test('expiry while the release is in flight to a host that is gone ends EXPIRED; the host cleans up when back', async () => {
  // Only host B serves the queue while the Run starts, so its sandbox lives there.
  await stack.stopWorker('host-a');
  await stack.startWorker('host-b');
  faults.putPlan = () => 'hang-after-upload';
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ writeFile: { path: 'a.txt', content: 'work' } }, { ask: 'anyone?' }] },
    sandbox: { provider: 'faulty' },
    policy: { suspendedRetentionSeconds: 15 },
  });
  const sandboxId = `${runId}-sbx`;
  await uploadedAndHeld(sandboxId);
  expect((await stack.client.runs.resource(runId)).record).toMatchObject({ state: 'RELEASING', hostId: 'host-b' });
  // Host B goes away mid-release (its worker stops; the sandbox's files and processes stay): the
  // release's next attempt waits on host B's queue, which nobody polls. B stops first, so the
  // expiry cannot find it up however long A takes to start on a loaded machine; A then serves
  // the shared queue.
  await stack.stopWorker('host-b');
  await stack.startWorker('host-a');

  // While the expiry waits for host B, the record says what is happening (it read ACTIVE).
  await eventually(
    async () => saw(await stack.client.runs.resource(runId)).record.state === 'DESTROYING',
    120_000,
    'the expiry destroying the sandbox',
  );
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const view = await stack.client.runs.resource(runId);
  expect(view.record).toMatchObject({
    state: 'DESTROYED',
    lastError: expect.stringMatching(/host host-b did not finish/),
  });
  expect(await stack.client.runs.get(runId)).toMatchObject({ status: 'EXPIRED', error: { code: 'SUSPEND_EXPIRED' } });
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  expect((await leftOn(stack, 'host-b', sandboxId)).directory).toBe(true);

  // Host B is back: its maintenance removes what the expiry could not.
  faults.putPlan = undefined;
  expect(await backAndMaintained(stack, 'host-b')).toEqual([sandboxId]);
  expect(await leftOn(stack, 'host-b', sandboxId)).toEqual({ directory: false, processes: 0 });
  await stack.stopWorker('host-b');
}, 240_000);
