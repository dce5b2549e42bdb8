import { existsSync } from 'node:fs';
import * as path from 'node:path';
import { sandboxPaths } from '../../providers/sandbox-state';
import { createCheckpointStore } from '../../stores';
import { maintainHost } from '../../workers/maintenance';
import { hostDataDir, leftOn } from '../helpers/hosts';
import { useStack, startStack } from '../helpers/stack';

const stack = useStack(() => startStack({ hostId: 'host-a' }));

test('resume on the original host reuses it while its worker answers', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.suspend(sandboxId);
  const resumed = await stack.client.sandboxes.resume(sandboxId);
  expect(resumed.hostId).toBe('host-a');
  await stack.client.sandboxes.destroy(sandboxId);
});

test('suspend on host A, stop A, resume: the sandbox runs on host B with the same files', async () => {
  // Another sandbox stays suspended on A: its dormant copy is named by a live record.
  const { sandboxId: staysOnA } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(staysOnA);
  await stack.client.sandboxes.suspend(staysOnA);
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  expect((await stack.client.sandboxes.start(sandboxId)).hostId).toBe('host-a');
  await stack.client.sandboxes.writeFile(sandboxId, 'state/progress.json', Buffer.from('{"step":41}'));
  await stack.client.sandboxes.exec(sandboxId, { command: 'mkdir -p out && seq 1 2000 > out/numbers.txt' });
  await stack.client.sandboxes.suspend(sandboxId);

  await stack.startWorker('host-b');
  await stack.stopWorker('host-a');
  // Host A no longer takes its queue: after the schedule-to-start timeout, any host restores.
  const resumed = await stack.client.sandboxes.resume(sandboxId);
  expect(resumed).toMatchObject({ state: 'running', hostId: 'host-b' });
  expect((await stack.client.sandboxes.readFile(sandboxId, 'state/progress.json')).toString()).toBe('{"step":41}');
  await expect(
    stack.client.sandboxes.exec(sandboxId, { command: 'wc -l < out/numbers.txt && echo $STASIS_SANDBOX_HOST' }),
  ).resolves.toMatchObject({
    exitCode: 0,
    stdout: '2000\nhost-b\n',
  });

  // Host A's maintenance: the copy that moved to B is an orphan (deleted after the TTL, clock on
  // disk); the one a live record still names on A is never touched.
  const hostA = path.join(stack.config.STASIS_DATA_DIR, 'hosts', 'host-a');
  const options = {
    config: { ...stack.config, STASIS_ORPHAN_DORMANT_DIR_TTL_SECONDS: 1 },
    dataDir: hostA,
    hostId: 'host-a',
    client: stack.temporal,
    registry: stack.workers.get('host-b')!.registry,
    store: createCheckpointStore(stack.config),
  };
  const first = await maintainHost(options);
  expect(first.orphans.marked).toEqual([sandboxId]);
  await new Promise((r) => setTimeout(r, 1_200));
  const second = await maintainHost(options);
  expect(second.orphans.deleted).toEqual([sandboxId]);
  expect(existsSync(sandboxPaths(hostA, sandboxId).root)).toBe(false);
  expect(existsSync(sandboxPaths(hostA, staysOnA).workspace)).toBe(true);

  await stack.client.sandboxes.destroy(sandboxId);
  expect(await stack.workers.get('host-b')!.registry.get('local').processCount(sandboxId)).toBe(0);
}, 180_000);

test('compute of a sandbox on a host its record does not name is stopped by that host, files kept; the real one runs on', async () => {
  // A provision or restore attempt that outlived its timeout on one host while a retry went to another
  // (a stalled or cut-off host): the same sandbox, started on the other host too, at the record's fence.
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.exec(sandboxId, { command: 'echo real > where.txt' });
  const { record } = await stack.client.sandboxes.get(sandboxId);
  const strayId = record.hostId === 'host-a' ? 'host-b' : 'host-a';
  const strayHost = stack.workers.get(strayId) ?? (await stack.startWorker(strayId));
  const provider = strayHost.registry.get('local');
  const context = { ownerId: `sandbox-${sandboxId}`, hostId: strayId };
  await provider.provision({ sandboxId, fence: record.fence }, context);
  await provider.start({ sandboxId, fence: record.fence }, context);
  expect((await leftOn(stack, strayId, sandboxId)).processes).toBeGreaterThan(0);

  await maintainHost({
    config: stack.config,
    dataDir: hostDataDir(stack, strayId),
    hostId: strayId,
    client: stack.temporal,
    registry: strayHost.registry,
    store: createCheckpointStore(stack.config),
  });
  expect(await leftOn(stack, strayId, sandboxId)).toEqual({ directory: true, processes: 0 });
  // The sandbox where its record puts it is untouched.
  await expect(stack.client.sandboxes.exec(sandboxId, { command: 'cat where.txt' })).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'real\n',
  });
  await stack.client.sandboxes.destroy(sandboxId);
}, 180_000);
