import type { Client } from '@temporalio/client';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ProviderRegistry } from '../../providers/registry';
import type { CheckpointStore } from '../../stores/api';
import { startMaintenance } from '../../workers/maintenance';
import { useStack, startStack } from '../helpers/stack';
import { tempDir } from '../providers/helpers';

// A worker's run() reconciles its host before its pollers start. A shutdown asked for in that
// window found both Temporal workers not yet RUNNING, skipped them, and they then polled forever:
// the shutdown never resolved (test/runs/expiry.test.ts hung on it under load).

const stack = useStack(() => startStack({ startWorker: false }));

test('a worker asked to stop right after it starts, while it still reconciles its host, stops', async () => {
  const worker = await stack.startWorker('host-quick');
  await stack.stopWorker('host-quick');
  await expect(worker.run()).resolves.toBeUndefined();
  expect(stack.workers.has('host-quick')).toBe(false);
}, 60_000);

test('stopping host maintenance stops a pass in flight before its next Temporal call and waits for it to end', async () => {
  // The provider-faults suite failed after all its tests passed: a maintenance pass still querying Temporal
  // when the worker closed its connection retried a call into the closed channel ("Channel has been shut down").
  let listed!: () => void;
  const listing = new Promise<void>((resolve) => (listed = resolve));
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const sandboxId = `maint-stop-${Date.now().toString(36)}-sbx`;
  const provider = {
    listSandboxes: async () => {
      listed();
      await gate;
      return [{ sandboxId }];
    },
  };
  const registry = { names: () => ['gated'], get: () => provider } as unknown as ProviderRegistry;
  const described: string[] = [];
  const failures: string[] = [];
  const temporal = stack.temporal;
  const getHandle = temporal.workflow.getHandle.bind(temporal.workflow);
  const client = Object.create(temporal, {
    workflow: {
      value: Object.create(temporal.workflow, {
        getHandle: {
          value: (id: string) => {
            const handle = getHandle(id);
            return Object.assign(Object.create(handle), {
              describe: async () => {
                described.push(id);
                try {
                  return await handle.describe();
                } catch (err) {
                  failures.push(String(err));
                  throw err;
                }
              },
            });
          },
        },
      }),
    },
  }) as Client;
  const stop = startMaintenance(
    {
      config: stack.config,
      dataDir: await tempDir('maint-stop'),
      registry,
      client,
      hostId: 'host-maint',
      store: { exists: async () => true } as unknown as CheckpointStore,
    },
    10,
  );
  await listing;
  let stopped = false;
  const stopping = stop().then(() => (stopped = true));
  await sleep(200);
  expect(stopped).toBe(false); // the pass is still in flight: stop waits for it
  release();
  await stopping;
  // The pass stopped at its next sandbox: nothing more was sent to Temporal after the stop.
  expect(described).toEqual([]);
  expect(failures).toEqual([]);
}, 60_000);
