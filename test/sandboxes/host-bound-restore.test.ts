import type { ProviderDeps, SandboxProvider } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { useStack, startStack } from '../helpers/stack';

// A provider that says crossHostRestore: false is restored only on the host that made the checkpoint.

function pinnedProvider(deps: ProviderDeps): SandboxProvider {
  const local = createLocalProvider(deps, { name: 'pinned' });
  return { ...local, capabilities: { ...local.capabilities, crossHostRestore: false } };
}

const stack = useStack(() => startStack({ hostId: 'host-a', worker: { providers: [pinnedProvider] } }));

test('its host gone, a resume is refused with 503 UNAVAILABLE and nothing is faked; once it is back, resume works there', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'pinned' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.writeFile(sandboxId, 'here.txt', Buffer.from('host a'));
  const suspended = await stack.client.sandboxes.suspend(sandboxId);

  await stack.startWorker('host-b');
  await stack.stopWorker('host-a');
  await expect(stack.client.sandboxes.resume(sandboxId)).rejects.toMatchObject({
    code: 'UNAVAILABLE',
    httpStatus: 503,
    message: expect.stringContaining('only be restored on host host-a'),
  });
  const view = await stack.client.sandboxes.get(sandboxId);
  expect(view).toMatchObject({
    state: 'suspended',
    hostId: 'host-a',
    record: { state: 'RELEASED', checkpoint: suspended.record.checkpoint },
  });
  await expect(stack.workers.get('host-b')!.registry.get('pinned').listSandboxes()).resolves.toEqual([]);

  await stack.startWorker('host-a');
  await stack.stopWorker('host-b');
  await expect(stack.client.sandboxes.resume(sandboxId)).resolves.toMatchObject({ state: 'running', hostId: 'host-a' });
  expect((await stack.client.sandboxes.readFile(sandboxId, 'here.txt')).toString()).toBe('host a');
  await stack.client.sandboxes.destroy(sandboxId);
}, 180_000);
