import { readFile } from 'node:fs/promises';
import * as path from 'node:path';
import { sandboxPaths } from '../../providers/sandbox-state';
import { createCheckpointStore } from '../../stores';
import { maintainHost } from '../../workers/maintenance';
import { sandboxWorkflowId } from '../../workflows/definitions';
import { hostDataDir, leftOn } from '../helpers/hosts';
import { startHeld } from '../helpers/runs';
import { useStack, startStack } from '../helpers/stack';

// An owner that ends without releasing its sandbox (terminated from Temporal Web, a workflow timeout)
// can no longer stop its processes: its host's maintenance does, and keeps the workspace.

const stack = useStack(() => startStack({ hostId: 'host-a' }));

/** One maintenance pass of host-a, with the stack's own worker. */
async function maintain() {
  const worker = stack.workers.get('host-a');
  if (!worker) throw new Error('no worker for host-a');
  return maintainHost({
    config: stack.config,
    dataDir: hostDataDir(stack, 'host-a'),
    hostId: 'host-a',
    client: stack.temporal,
    registry: worker.registry,
    store: createCheckpointStore(stack.config),
  });
}

const workspaceFile = (sandboxId: string, name: string) =>
  readFile(path.join(sandboxPaths(hostDataDir(stack, 'host-a'), sandboxId).workspace, name), 'utf8');

/** A held Run (DETACH: its compute keeps running); its id and sandbox id. */
async function heldRun(): Promise<{ runId: string; sandboxId: string }> {
  const { runId, held } = await startHeld(stack.client);
  expect(held.record.pauseMode).toBe('DETACH');
  return { runId, sandboxId: held.record.sandboxId };
}

test('a Run terminated while its compute runs has its processes stopped by its host, its workspace kept; a live neighbour is untouched', async () => {
  const ended = await heldRun();
  const neighbour = await heldRun();
  expect((await leftOn(stack, 'host-a', ended.sandboxId)).processes).toBeGreaterThan(0);

  await stack.temporal.workflow.getHandle(ended.runId).terminate('an operator in Temporal Web');
  const pass = await maintain();
  // The worker's own pass (every minute) may have come first; none stops anything else.
  expect(pass.stopped.filter((id) => id !== ended.sandboxId)).toEqual([]);
  expect(await leftOn(stack, 'host-a', ended.sandboxId)).toEqual({ directory: true, processes: 0 });
  expect(await workspaceFile(ended.sandboxId, 'notes.txt')).toBe('kept\n');
  expect((await leftOn(stack, 'host-a', neighbour.sandboxId)).processes).toBeGreaterThan(0);

  // Nothing is left to do for it: the next pass stops nothing and removes nothing.
  expect(await maintain()).toMatchObject({ stopped: [], destroyed: [] });
  await stack.client.runs.cancel(neighbour.runId);
}, 180_000);

test('a standalone sandbox whose workflow was terminated has its processes stopped, its files kept', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.exec(sandboxId, { command: 'echo mine > f.txt; (sleep 600 > /dev/null 2>&1 &)' });
  expect((await leftOn(stack, 'host-a', sandboxId)).processes).toBeGreaterThan(0);

  await stack.temporal.workflow.getHandle(sandboxWorkflowId(sandboxId)).terminate('an operator');
  const pass = await maintain();
  expect(pass.stopped.filter((id) => id !== sandboxId)).toEqual([]);
  expect(await leftOn(stack, 'host-a', sandboxId)).toEqual({ directory: true, processes: 0 });
  expect(await workspaceFile(sandboxId, 'f.txt')).toBe('mine\n');
}, 120_000);

test('one sandbox whose stop fails is logged and does not hold up the pass: the next sandbox is still stopped', async () => {
  const sandboxes: string[] = [];
  for (let i = 0; i < 2; i += 1) {
    const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
    await stack.client.sandboxes.start(sandboxId);
    await stack.client.sandboxes.exec(sandboxId, { command: '(sleep 600 > /dev/null 2>&1 &)' });
    sandboxes.push(sandboxId);
  }
  // Both at once, right before the pass: the worker's own pass (every minute) then hardly ever comes between.
  for (const sandboxId of sandboxes)
    await stack.temporal.workflow.getHandle(sandboxWorkflowId(sandboxId)).terminate('an operator');
  const worker = stack.workers.get('host-a');
  if (!worker) throw new Error('no worker for host-a');
  // The first of the two the pass tries to stop fails, whichever it is.
  let failed: string | undefined;
  const registry = Object.create(worker.registry) as typeof worker.registry;
  registry.get = (name) => {
    const provider = worker.registry.get(name);
    return new Proxy(provider, {
      get: (target, prop) => {
        if (prop === 'stop')
          return async (request: { sandboxId: string }, context: never) => {
            if (failed === undefined && sandboxes.includes(request.sandboxId)) {
              failed = request.sandboxId;
              throw new Error('the disk went away');
            }
            return target.stop(request as never, context);
          };
        const value = Reflect.get(target, prop, target) as unknown;
        return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
      },
    });
  };
  const warn = jest.spyOn(console, 'warn');
  try {
    const pass = await maintainHost({
      config: stack.config,
      dataDir: hostDataDir(stack, 'host-a'),
      hostId: 'host-a',
      client: stack.temporal,
      registry,
      store: createCheckpointStore(stack.config),
    });
    if (failed === undefined) throw new Error('the pass tried to stop neither sandbox');
    const other = sandboxes.find((id) => id !== failed);
    expect(pass.stopped).toContain(other);
    expect(pass.stopped).not.toContain(failed);
    expect(warn).toHaveBeenCalledWith(
      expect.stringContaining(`could not stop sandbox ${failed}: Error: the disk went away`),
    );
    expect((await leftOn(stack, 'host-a', failed)).processes).toBeGreaterThan(0);
    expect(await leftOn(stack, 'host-a', other ?? '')).toEqual({ directory: true, processes: 0 });
  } finally {
    warn.mockRestore();
  }
  // The next pass, with the stop working again, stops the one that failed.
  expect((await maintain()).stopped).toContain(failed);
  expect(await leftOn(stack, 'host-a', failed)).toEqual({ directory: true, processes: 0 });
}, 180_000);
