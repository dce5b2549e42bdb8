import type { SandboxProvider } from '../../providers/api';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { evictDormantCopies } from '../helpers/hosts';
import { startStack, eventually, type TestStack } from '../helpers/stack';
import { context, stasisError } from '../providers/helpers';

// File operations against state changes: a write is either in the checkpoint or refused.

const faults: ReleaseFaults = { calls: [] };
let stack: TestStack;
let faulty: SandboxProvider;
beforeAll(async () => {
  stack = await startStack({ worker: { providers: [faultyProvider(faults)] } });
  faulty = stack.workers.get('host-a')!.registry.get('faulty');
});
afterAll(async () => {
  await stack?.stop();
});

async function running(policy?: { timeout: string }): Promise<string> {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'faulty', ...(policy ? { policy } : {}) });
  await stack.client.sandboxes.start(sandboxId);
  return sandboxId;
}

const settle = <T>(p: Promise<T>) =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (error: { code?: string }) => ({ ok: false as const, error }),
  );

test('a slow write racing a suspend is in the checkpoint or refused, never lost', async () => {
  const id = await running();
  let open = () => {};
  faults.writeGate = new Promise<void>((resolve) => (open = resolve));
  const write = settle(stack.client.sandboxes.writeFile(id, 'race.txt', Buffer.from('written')));
  await eventually(
    async () => faults.writeCalls?.some((c) => c.sandboxId === id && c.outcome === 'held'),
    20_000,
    'write held on the host',
  );
  const suspend = await settle(stack.client.sandboxes.suspend(id));
  open();
  faults.writeGate = undefined;
  const written = await write;
  if (!suspend.ok) expect(suspend.error).toMatchObject({ code: 'SANDBOX_SUSPEND_BUSY' });
  if (!written.ok) expect(written.error).toMatchObject({ code: 'INVALID_STATE_TRANSITION' });

  // Whatever won, what was acknowledged must come back from the checkpoint itself.
  if (!suspend.ok) await stack.client.sandboxes.suspend(id);
  expect(await evictDormantCopies(stack)).toContain(id);
  await stack.client.sandboxes.resume(id);
  const read = await settle(stack.client.sandboxes.readFile(id, 'race.txt'));
  if (written.ok) expect(read).toMatchObject({ ok: true, value: Buffer.from('written') });
  else expect(read).toMatchObject({ ok: false, error: { code: 'NOT_FOUND' } });
  await stack.client.sandboxes.destroy(id);
});

test('the provider refuses a write that arrives after a snapshot release, or from a superseded fence', async () => {
  const id = await running();
  const view = await stack.client.sandboxes.suspend(id);
  const fence = view.record.fence;
  // A late attempt of a write scheduled before the suspend reaches the dormant copy.
  await stasisError(
    faulty.writeFile({ sandboxId: id, fence, path: 'late.txt', content: Buffer.from('x') }, context()),
    'INVALID_STATE_TRANSITION',
  );
  await stack.client.sandboxes.resume(id);
  await stasisError(
    faulty.writeFile({ sandboxId: id, fence, path: 'late.txt', content: Buffer.from('x') }, context()),
    'STALE_FENCE',
  );
  await stasisError(faulty.readFile({ sandboxId: id, fence, path: 'late.txt' }, context()), 'STALE_FENCE');
  await expect(stack.client.sandboxes.readFile(id, 'late.txt')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  await stack.client.sandboxes.destroy(id);
});

test('file operations keep an idle sandbox awake: the idle timer runs from the end of the last one', async () => {
  const id = await running({ timeout: '3s' });
  let open = () => {};
  faults.writeGate = new Promise<void>((resolve) => (open = resolve));
  const write = stack.client.sandboxes.writeFile(id, 'slow.txt', Buffer.from('slow'));
  await eventually(
    async () => faults.writeCalls?.some((c) => c.sandboxId === id && c.outcome === 'held'),
    20_000,
    'write held on the host',
  );
  // Longer than the idle timeout while the write is under way: the sandbox must not be paused under it.
  await new Promise((r) => setTimeout(r, 5_000));
  expect((await stack.client.sandboxes.get(id)).state).toBe('running');
  open();
  faults.writeGate = undefined;
  await write;
  expect((await stack.client.sandboxes.get(id)).state).toBe('running');
  await eventually(
    async () => (await stack.client.sandboxes.get(id)).state === 'paused',
    30_000,
    'idle pause after the write',
  );
  await stack.client.sandboxes.destroy(id);
});
