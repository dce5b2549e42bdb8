import type { Client } from '@temporalio/client';
import { getEventListeners } from 'node:events';
import type { ProviderRegistry } from '../../providers/registry';
import type { CheckpointStore } from '../../stores/api';
import { startMaintenance } from '../../workers/maintenance';
import { useStack, startStack } from '../helpers/stack';
import { tempDir, uniqueId } from '../providers/helpers';

// The SDK's client hangs an 'abort' listener holding the call on the signal in scope (withAbortSignal) for
// every call and never removes it. Host maintenance ran all its passes under one signal for the worker's
// life: a heap snapshot of a worker with 300 waiting Runs showed that signal holding every describe and
// query of every pass (21 KiB per waiting Run after 4 minutes, growing each minute).

const stack = useStack(() => startStack({ startWorker: false }));

test('host maintenance leaves no signal holding the Temporal calls of its passes', async () => {
  const sandboxIds = Array.from({ length: 5 }, () => `${uniqueId('maint-sig')}-sbx`); // Runs that do not exist
  const passes = 4;
  let listed = 0;
  let done!: () => void;
  const enough = new Promise<void>((resolve) => (done = resolve));
  const provider = {
    listSandboxes: async () => {
      if (++listed === passes + 1) done(); // the earlier passes have ended: one pass at a time
      return sandboxIds.map((sandboxId) => ({ sandboxId }));
    },
  };
  const registry = { names: () => ['listing'], get: () => provider } as unknown as ProviderRegistry;
  const temporal = stack.temporal;
  // Every signal the client's calls ran under, the calls themselves go to the real server.
  const signals: AbortSignal[] = [];
  const client = Object.create(temporal, {
    withAbortSignal: {
      value: <R>(signal: AbortSignal, fn: () => Promise<R>) => {
        signals.push(signal);
        return temporal.withAbortSignal(signal, fn);
      },
    },
  }) as Client;
  const stop = startMaintenance(
    {
      config: stack.config,
      dataDir: await tempDir('maint-sig'),
      registry,
      client,
      hostId: 'host-maint-sig',
      store: { exists: async () => true } as unknown as CheckpointStore,
    },
    10,
  );
  await enough;
  await stop();
  // Each pass described every sandbox (5 calls); a signal that outlived them would hold 5 per pass.
  expect(signals.length).toBeGreaterThan(passes);
  expect(Math.max(...signals.map((signal) => getEventListeners(signal, 'abort').length))).toBeLessThanOrEqual(1);
}, 60_000);
