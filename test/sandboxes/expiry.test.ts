import { backAndMaintained, leftOn } from '../helpers/hosts';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';
import { useStack, eventually, saw, startStack } from '../helpers/stack';

// A standalone sandbox's retention expiry keeps nothing and never waits for a host that is gone:
// what that host could not remove, its maintenance removes once it is back.

const faults: ReleaseFaults = { calls: [] };
const s3 = testS3();
const stack = useStack(() =>
  startStack({
    hostId: 'host-a',
    env: { STASIS_SUSPENDED_RETENTION_SECONDS: '45' },
    worker: { providers: [faultyProvider(faults)] },
  }),
);

test('retention expiry while the release is in flight to a host that is gone: expires, deletes every checkpoint, says DESTROYING then DESTROYED; the host cleans up when back', async () => {
  // Only host B serves the queue while the sandbox is created, so it lives there.
  await stack.stopWorker('host-a');
  await stack.startWorker('host-b');
  const sandboxes = stack.client.sandboxes;
  const { sandboxId } = await sandboxes.create({ provider: 'faulty' });
  await sandboxes.start(sandboxId);
  await sandboxes.writeFile(sandboxId, 'a.txt', Buffer.from('work'));
  // A first fence with its checkpoint...
  await sandboxes.suspend(sandboxId);
  await sandboxes.resume(sandboxId);
  // ...and a second release whose upload lands but whose answer never comes.
  faults.putPlan = (id) => (id === sandboxId ? 'hang-after-upload' : undefined);
  const suspending = sandboxes.suspend(sandboxId);
  await eventually(
    async () => faults.putCalls?.some((c) => c.sandboxId === sandboxId && c.outcome === 'uploaded, answer held'),
    60_000,
    'a checkpoint uploaded whose answer is held',
  );
  // A checkpoint of each fence is in the store (whatever else the format stores beside them).
  const fences = (await checkpointKeys(s3, sandboxId)).map((k) => k.split('/')[2].split('-')[0]);
  expect(fences).toEqual(expect.arrayContaining(['1', '2']));
  expect((await sandboxes.get(sandboxId)).record).toMatchObject({ state: 'RELEASING', hostId: 'host-b' });

  // Host B goes away for now (its worker stops; the sandbox's files and processes stay): the
  // release's next attempt waits on host B's queue, which nobody polls. A serves the shared queue.
  await stack.stopWorker('host-b');
  await stack.startWorker('host-a');
  await expect(suspending).resolves.toMatchObject({ state: 'suspended' });

  // While the expiry waits for host B, the record says what is happening.
  await eventually(
    async () => {
      const view = saw(await sandboxes.get(sandboxId));
      return view.state === 'suspended' && view.record.state === 'DESTROYING';
    },
    120_000,
    'the expiry destroying the sandbox',
  );
  // Once the expiry begins, the route is stale.
  await expect(sandboxes.resume(sandboxId)).rejects.toMatchObject({ code: 'STALE_SANDBOX_ROUTE', httpStatus: 409 });
  const expired = await eventually(
    async () => {
      const view = saw(await sandboxes.get(sandboxId));
      return view.error?.code === 'SUSPEND_EXPIRED' ? view : undefined;
    },
    120_000,
    'the expiry done',
  );
  expect(expired).toMatchObject({
    state: 'suspended',
    error: { code: 'SUSPEND_EXPIRED' },
    record: { state: 'DESTROYED', lastError: expect.stringMatching(/host host-b did not finish/) },
  });
  // DESTROYED once every checkpoint is gone.
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  await expect(sandboxes.resume(sandboxId)).rejects.toMatchObject({ code: 'STALE_SANDBOX_ROUTE', httpStatus: 409 });
  // Not removed yet: nothing ran on host B.
  expect((await leftOn(stack, 'host-b', sandboxId)).directory).toBe(true);

  // Host B is back: its maintenance removes what the expiry could not.
  faults.putPlan = undefined;
  expect(await backAndMaintained(stack, 'host-b')).toEqual([sandboxId]);
  expect(await leftOn(stack, 'host-b', sandboxId)).toEqual({ directory: false, processes: 0 });
  await stack.stopWorker('host-b');
  // Destroy after expiry still answers (nothing left to remove).
  await expect(sandboxes.destroy(sandboxId)).resolves.toMatchObject({ state: 'destroyed' });
}, 400_000);
