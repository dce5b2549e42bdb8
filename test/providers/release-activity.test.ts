import * as path from 'node:path';
import { MockActivityEnvironment } from '@temporalio/testing';
import * as fc from 'fast-check';
import { WorkerMetrics } from '../../activities/metrics';
import { createProviderActivities } from '../../activities/provider';
import type { PauseMode } from '../../common/schemas';
import { FsFiguresStore, type FiguresStore, type HostFigures } from '../../stores/figures';
import { makeHost, type Host } from './harness';
import { tempDir, uniqueId } from './helpers';

// The releaseSandbox activity against a real local provider and a real (fs) figures store whose
// writes are held back: the release answers without waiting for the durable figures (diagnostics
// are off its path), its receipt still guards exactly-once on its own, and the figures count every
// release once the writes go through — what a worker's normal shutdown waits for (flushed()).

let host: Host;

beforeAll(async () => {
  host = await makeHost();
});

/** A real fs figures store whose writes wait until `open()`; `held` counts the writes waiting. */
async function heldStore(): Promise<{ store: FiguresStore; inner: FsFiguresStore; open(): void; held(): number }> {
  const inner = new FsFiguresStore(path.join(await tempDir('figures'), 'metrics'));
  let gate: Promise<void> | undefined;
  let release = () => undefined as void;
  let waiting = 0;
  const close = () => {
    gate = new Promise<void>((resolve) => (release = resolve));
  };
  close();
  return {
    inner,
    store: {
      async write(figures: HostFigures) {
        waiting += 1;
        await gate;
        waiting -= 1;
        await inner.write(figures);
      },
      read: (hostId) => inner.read(hostId),
      readAll: () => inner.readAll(),
    },
    open() {
      gate = undefined;
      release();
    },
    held: () => waiting,
  };
}

test('a release answers while the durable figures write is held; a retry is still a duplicate; the figures then count every release', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.constantFrom<PauseMode>('DETACH', 'SNAPSHOT_AND_TERMINATE'), { minLength: 1, maxLength: 3 }),
      async (modes) => {
        const held = await heldStore();
        const metrics = await WorkerMetrics.load(host.hostId, held.store);
        const activities = createProviderActivities({
          hostId: host.hostId,
          provider: () => host.provider,
          metrics,
          hostPaths: { allowed: [] },
        });
        const release = (request: Parameters<typeof activities.releaseSandbox>[0]['request'], attempt: number) =>
          new MockActivityEnvironment({ attempt }).run(activities.releaseSandbox, {
            provider: 'local',
            ownerId: 'run-test',
            request,
          });
        for (const [i, mode] of modes.entries()) {
          const sandboxId = await host.sandbox();
          const request = { sandboxId, idempotencyKey: uniqueId('rel'), mode, fence: 1, reason: 'test' };
          // Answered with the figures' write still held: it is not on the release's path.
          const receipt = await release(request, 1);
          expect(receipt).toMatchObject({ sandboxId, mode, duplicate: false, attempt: 1 });
          expect(held.held()).toBeGreaterThan(0);
          // The receipt, not the figures, guards exactly-once: a retried attempt finds it.
          expect(await release(request, 2)).toMatchObject({ sandboxId, duplicate: true, attempt: 2 });
          // Counted at once where the host's scrape and snapshot read it.
          expect(metrics.snapshot().releases).toBe(2 * (i + 1));
        }
        expect(await held.inner.read(host.hostId)).toBeUndefined();
        held.open();
        await metrics.flushed();
        expect(await held.inner.read(host.hostId)).toMatchObject({
          releases: 2 * modes.length,
          retries: modes.length,
          failures: 0,
        });
        expect((await held.inner.read(host.hostId))?.releaseLatencyMs).toHaveLength(2 * modes.length);
      },
    ),
    { numRuns: 4 },
  );
});
