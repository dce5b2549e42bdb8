import { MockActivityEnvironment } from '@temporalio/testing';
import * as fc from 'fast-check';
import { WorkerMetrics } from '../../activities/metrics';
import { createProviderActivities } from '../../activities/provider';
import type { SandboxProvider } from '../../providers/api';
import { ProviderRegistry } from '../../providers/registry';
import { checkpointPrefix } from '../../providers/snapshot';
import { makeHost, sh, type Host } from './harness';
import { context, s3StoreFromEnv, uniqueId } from './helpers';

// The destroy sandboxOp says the sandbox's checkpoints are gone only when they are: the workflow then
// sends no delete of its own (workflows/coordinator.ts). A provider that does not say so (a plugin),
// or a destroy that fails, leaves that delete to the workflow.

let host: Host;

beforeAll(async () => {
  host = await makeHost({ store: s3StoreFromEnv() });
});

function activitiesFor(provider: SandboxProvider) {
  return createProviderActivities({
    hostId: host.hostId,
    provider: () => provider,
    metrics: new WorkerMetrics(host.hostId),
    hostPaths: { allowed: [] },
  });
}

const destroy = (provider: SandboxProvider, sandboxId: string, fence: number, ask = true) =>
  new MockActivityEnvironment().run(activitiesFor(provider).sandboxOp, {
    provider: 'local',
    ownerId: 'run-test',
    op: 'destroy' as const,
    request: { sandboxId, fence },
    ...(ask ? { reportCheckpointsDeleted: true } : {}),
  });

/** A sandbox with `releases` checkpoints in the store (each release at a fence of its own, each resumed). */
async function withCheckpoints(releases: number): Promise<{ sandboxId: string; fence: number }> {
  const sandboxId = await host.sandbox();
  let fence = 1;
  for (let i = 0; i < releases; i++) {
    await sh(host.provider, sandboxId, `echo ${i} > f${i}`, fence);
    const receipt = await host.provider.release(
      { sandboxId, fence: ++fence, idempotencyKey: uniqueId('rel'), mode: 'SNAPSHOT_AND_TERMINATE', reason: 'test' },
      context(),
    );
    await host.provider.restore(
      { sandboxId, fence: ++fence, ...(receipt.checkpoint ? { checkpoint: receipt.checkpoint } : {}) },
      context(),
    );
  }
  return { sandboxId, fence };
}

const stored = async (sandboxId: string) => (await host.store.list(checkpointPrefix(sandboxId))).length;

test('the local provider destroy answers checkpointsDeleted only with nothing left under the sandbox prefix', async () => {
  await fc.assert(
    fc.asyncProperty(fc.integer({ min: 0, max: 2 }), async (releases) => {
      const { sandboxId, fence } = await withCheckpoints(releases);
      if (releases > 0) expect(await stored(sandboxId)).toBeGreaterThan(0);
      expect(await destroy(host.provider, sandboxId, fence)).toEqual({ checkpointsDeleted: true });
      expect(await stored(sandboxId)).toBe(0);
      // Again (a retried attempt, the sandbox already gone): still true, still nothing there.
      expect(await destroy(host.provider, sandboxId, fence)).toEqual({ checkpointsDeleted: true });
    }),
    { numRuns: 4 },
  );
}, 120_000);

test('a destroy scheduled without asking (workflow code of an earlier version) is answered nothing, though the checkpoints went', async () => {
  const { sandboxId, fence } = await withCheckpoints(1);
  expect(await destroy(host.provider, sandboxId, fence, false)).toBeUndefined();
  expect(await stored(sandboxId)).toBe(0);
}, 60_000);

test('a provider that does not say its destroy deletes checkpoints answers nothing: the workflow deletes them', async () => {
  const { sandboxId, fence } = await withCheckpoints(1);
  // A plugin's destroy that removes the sandbox and keeps every checkpoint (it never said otherwise).
  const plugin: SandboxProvider = { ...host.provider, destroyDeletesCheckpoints: undefined, destroy: async () => {} };
  expect(await destroy(plugin, sandboxId, fence)).toBeUndefined();
  expect(await stored(sandboxId)).toBeGreaterThan(0);
  await host.provider.destroy({ sandboxId, fence }, context());
});

test('a destroy that fails claims nothing, even from a provider that deletes checkpoints', async () => {
  const { sandboxId, fence } = await withCheckpoints(1);
  // A superseded fence: the provider refuses the destroy, and the checkpoints stay for the workflow to delete.
  await expect(destroy(host.provider, sandboxId, fence - 1)).rejects.toThrow(/fence/i);
  expect(await stored(sandboxId)).toBeGreaterThan(0);
  await host.provider.destroy({ sandboxId, fence }, context());
});

test('a plugin whose destroyDeletesCheckpoints is not a boolean is refused when it is registered', () => {
  const registry = new ProviderRegistry({ hostId: host.hostId, dataDir: host.dataDir, store: host.store });
  for (const bad of ['true', 1, {}, null])
    expect(() =>
      registry.register({ ...host.provider, name: uniqueId('plugin'), destroyDeletesCheckpoints: bad } as never),
    ).toThrow(/destroyDeletesCheckpoints/);
});
