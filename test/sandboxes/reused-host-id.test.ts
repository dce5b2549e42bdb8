import * as fs from 'node:fs/promises';
import { killSandbox } from '../../providers/processes';
import { eventually, saw, useStack, startStack } from '../helpers/stack';
import { hostDataDir } from '../helpers/hosts';

// A host id reused: host-a's machine dies with its disk and a new machine starts under the same STASIS_HOST_ID
// with an empty data dir. Its reconcile found nothing on disk to report, so a sandbox running there stayed
// `running` (record ACTIVE on host-a) for good, and every call failed NOT_FOUND on host-a.

const stack = useStack(() => startStack({ hostId: 'host-a' }));

test('a worker that starts without the sandboxes its host id ran reports them lost; a suspended one stays suspended', async () => {
  const { sandboxId: running } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(running);
  const { sandboxId: suspended } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(suspended);
  await stack.client.sandboxes.writeFile(suspended, 'f.txt', Buffer.from('kept'));
  await stack.client.sandboxes.suspend(suspended);

  // The machine dies: its worker, its processes and its disk are gone; a new machine takes over the id.
  await stack.stopWorker('host-a');
  await killSandbox({ hostId: 'host-a', sandboxId: running });
  await fs.rm(hostDataDir(stack, 'host-a'), { recursive: true, force: true });
  await stack.startWorker('host-a');

  const lost = await eventually(
    async () => {
      const view = saw(await stack.client.sandboxes.get(running));
      return view.state === 'lost' && view;
    },
    30_000,
    'the running sandbox to be lost',
  );
  expect(lost).toMatchObject({ state: 'lost', hostId: 'host-a', error: { code: 'LOST' } });
  // A suspended sandbox keeps its checkpoint: it is not lost, and resumes from the checkpoint on the new machine.
  expect((await stack.client.sandboxes.get(suspended)).state).toBe('suspended');
  await expect(stack.client.sandboxes.resume(suspended)).resolves.toMatchObject({ state: 'running', hostId: 'host-a' });
  expect((await stack.client.sandboxes.readFile(suspended, 'f.txt')).toString()).toBe('kept');
  await stack.client.sandboxes.destroy(suspended);
  await stack.client.sandboxes.destroy(running);
}, 180_000);
