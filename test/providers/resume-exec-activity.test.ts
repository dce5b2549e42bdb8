import * as path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import * as fc from 'fast-check';
import { WorkerMetrics } from '../../activities/metrics';
import {
  createProviderActivities,
  type BringBack,
  type ResumedExec,
  type ResumedThenFailed,
} from '../../activities/provider';
import type { Checkpoint, Hashes, PauseMode } from '../../common/schemas';
import type { SandboxProvider } from '../../providers/api';
import { FsFiguresStore } from '../../stores/figures';
import { makeHost, type Host } from './harness';
import { context, uniqueId } from './helpers';

// The fused resume (resumeAndExecInSandbox) against a real local provider, with faults injected
// inside it: however its attempts fail, a retry brings the sandbox back again harmlessly and the
// job runs exactly once (the job journal), and a checkpoint recorded under other hashes runs nothing.

const HASHES: Hashes = { run: 'r'.repeat(64), spec: 's'.repeat(64), policy: 'p'.repeat(64) };
const LABELS = { runhash: HASHES.run, spechash: HASHES.spec, policyhash: HASHES.policy };

type Fault = 'none' | 'before-restore' | 'before-exec' | 'after-exec';

let host: Host;
let fault: Fault = 'none';
let activities: ReturnType<typeof createProviderActivities>;

/** The host's provider with `fault` injected once: before the bring-back, before the job, or after it ran (its answer lost). */
function faulty(provider: SandboxProvider): SandboxProvider {
  const take = (which: Fault) => {
    if (fault !== which) return false;
    fault = 'none';
    return true;
  };
  const lost = (where: string) => new Error(`injected: ${where}`);
  return {
    ...provider,
    async restore(request, ctx) {
      if (take('before-restore')) throw lost('before restore');
      return provider.restore(request, ctx);
    },
    async attach(request, ctx) {
      if (take('before-restore')) throw lost('before attach');
      return provider.attach(request, ctx);
    },
    async exec(request, ctx) {
      if (take('before-exec')) throw lost('before exec');
      const outcome = await provider.exec(request, ctx);
      if (take('after-exec')) throw lost('after exec');
      return outcome;
    },
  };
}

beforeAll(async () => {
  host = await makeHost();
  const metrics = await WorkerMetrics.load(host.hostId, new FsFiguresStore(path.join(host.dataDir, 'metrics')));
  const provider = faulty(host.provider);
  activities = createProviderActivities({
    hostId: host.hostId,
    provider: () => provider,
    metrics,
    hostPaths: { allowed: [] },
  });
});

/** A started sandbox with a file, released in `mode` at fence 1 (checkpoint labelled with HASHES). */
async function released(mode: PauseMode): Promise<{ sandboxId: string; checkpoint?: Checkpoint }> {
  const sandboxId = await host.sandbox();
  await host.provider.exec({ sandboxId, fence: 1, jobId: 'job-0', command: 'echo before > log' }, context());
  const receipt = await host.provider.release(
    { sandboxId, idempotencyKey: uniqueId('rel'), mode, fence: 1, reason: 'test' },
    context({ labels: LABELS }),
  );
  return { sandboxId, ...(receipt.checkpoint ? { checkpoint: receipt.checkpoint } : {}) };
}

function bringBackOf(mode: PauseMode, sandboxId: string, checkpoint?: Checkpoint): BringBack {
  const request = { sandboxId, fence: 2 };
  return mode === 'DETACH'
    ? { op: 'attach', request }
    : {
        op: 'restore',
        request: { ...request, ...(checkpoint ? { checkpoint } : {}), workspace: { kind: 'isolated' } },
      };
}

const fused = (input: Parameters<typeof activities.resumeAndExecInSandbox>[0], attempt: number) =>
  new MockActivityEnvironment({ attempt }).run(activities.resumeAndExecInSandbox, input) as Promise<ResumedExec>;

/** The workspace's log, read by a job of its own at the new fence. */
const log = async (sandboxId: string) =>
  (await host.provider.exec({ sandboxId, fence: 2, jobId: uniqueId('read'), command: 'cat log' }, context())).stdout;

test('whatever fails inside its attempts, a retried fused resume brings the sandbox back and runs the job exactly once', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom<PauseMode>('DETACH', 'SNAPSHOT_AND_TERMINATE'),
      fc.array(fc.constantFrom<Fault>('before-restore', 'before-exec', 'after-exec'), { maxLength: 3 }),
      async (mode, faults) => {
        const { sandboxId, checkpoint } = await released(mode);
        const input = {
          provider: 'local',
          ownerId: 'run-test',
          bringBack: bringBackOf(mode, sandboxId, checkpoint),
          expect: HASHES,
          request: { sandboxId, fence: 2, jobId: 'job-1', command: 'echo ran >> log; cat log' },
        };
        // One attempt per fault, as Temporal retries them; then one that nothing breaks.
        for (const [i, f] of faults.entries()) {
          fault = f;
          const err = await fused(input, i + 1).then(
            () => undefined,
            (e: unknown) => e,
          );
          if (f === 'before-restore') {
            // The sandbox never came back: a plain error, the workflow rolls the resume back.
            expect(err).toBeInstanceOf(Error);
            expect(err).not.toBeInstanceOf(ApplicationFailure);
          } else {
            // Back, and only the job failed: the details say where the sandbox is.
            expect(err).toBeInstanceOf(ApplicationFailure);
            const details = (err as ApplicationFailure).details?.[0] as ResumedThenFailed;
            expect(details.resumedThenFailed.hostId).toBe(host.hostId);
          }
        }
        fault = 'none';
        const result = await fused(input, faults.length + 1);
        expect(result.outcome).toMatchObject({ exitCode: 0, stdout: 'before\nran\n' });
        if (mode === 'SNAPSHOT_AND_TERMINATE') expect(result.resumed.restored?.labels).toMatchObject(LABELS);
        // A retry after the answer was lost: the journal's outcome, never a second run.
        expect((await fused(input, faults.length + 2)).outcome).toEqual(result.outcome);
        expect(await log(sandboxId)).toBe('before\nran\n');
        await host.provider.destroy({ sandboxId, fence: 2 }, context());
      },
    ),
    { numRuns: 12 },
  );
});

test('a checkpoint recorded under other hashes is restored but runs nothing', async () => {
  const { sandboxId, checkpoint } = await released('SNAPSHOT_AND_TERMINATE');
  const result = await fused(
    {
      provider: 'local',
      ownerId: 'run-test',
      bringBack: bringBackOf('SNAPSHOT_AND_TERMINATE', sandboxId, checkpoint),
      expect: { ...HASHES, spec: '0'.repeat(64) },
      request: { sandboxId, fence: 2, jobId: 'job-1', command: 'echo ran >> log' },
    },
    1,
  );
  expect(result.outcome).toBeUndefined();
  expect(result.resumed.restored?.labels).toMatchObject(LABELS);
  expect(await log(sandboxId)).toBe('before\n');
  await host.provider.destroy({ sandboxId, fence: 2 }, context());
});
