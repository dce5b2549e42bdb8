import { killSandbox } from '../../providers/processes';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { useStack, startStack } from '../helpers/stack';

// What a standalone suspend claims must be what the release did.

const faults: ReleaseFaults = { calls: [] };
const stack = useStack(() => startStack({ worker: { providers: [faultyProvider(faults)] } }));

async function running(): Promise<string> {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'faulty' });
  await stack.client.sandboxes.start(sandboxId);
  return sandboxId;
}

const processes = (sandboxId: string) => stack.workers.get('host-a')!.registry.get('faulty').processCount(sandboxId);

test('a snapshot receipt without its checkpoint does not count: the release is retried until one has it', async () => {
  const id = await running();
  faults.releasePlan = (sandboxId, attempt) => (sandboxId === id && attempt === 1 ? 'no-checkpoint' : undefined);
  const suspended = await stack.client.sandboxes.suspend(id);
  expect(suspended).toMatchObject({ state: 'suspended', record: { state: 'RELEASED', attempts: 2 } });
  expect(suspended.record.checkpoint?.uri).toContain(`checkpoints/${id}/`);
  expect(faults.calls.filter((c) => c.sandboxId === id).map((c) => c.outcome)).toEqual([
    'released (checkpoint dropped)',
    'duplicate',
  ]);
  await stack.client.sandboxes.destroy(id);
});

test.each(['stale-fence', 'idempotency-conflict'] as const)(
  'a release refused for good (%s) is not a suspend: 409, the sandbox still runs, the record says why',
  async (fault) => {
    const id = await running();
    faults.releasePlan = (sandboxId) => (sandboxId === id ? fault : undefined);
    const code = fault === 'stale-fence' ? 'STALE_FENCE' : 'IDEMPOTENCY_CONFLICT';
    await expect(stack.client.sandboxes.suspend(id)).rejects.toMatchObject({ code, httpStatus: 409 });
    const view = await stack.client.sandboxes.get(id);
    expect(view.state).toBe('running');
    expect(view.record.state).toBe('ACTIVE');
    expect(view.record.lastError).toContain(code === 'STALE_FENCE' ? 'fence' : 'idempotency key');
    expect(await processes(id)).toBeGreaterThan(0);
    faults.releasePlan = undefined;
    // After a stale fence the sandbox belongs to the newer owner: only that owner could destroy it.
    if (fault === 'stale-fence') await killSandbox({ sandboxId: id, hostId: 'host-a' });
    else await stack.client.sandboxes.destroy(id);
  },
);
