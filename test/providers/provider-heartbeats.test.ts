import { MockActivityEnvironment } from '@temporalio/testing';
import * as fc from 'fast-check';
import { WorkerMetrics } from '../../activities/metrics';
import { createProviderActivities, QUIET_START_MS, type BringBack, type ResumedExec } from '../../activities/provider';
import type { PauseMode } from '../../common/schemas';
import type { ExecOutcome, SandboxReleaseReceipt } from '../../providers/api';
import { FsFiguresStore } from '../../stores/figures';
import { makeHost, type Host } from './harness';
import { tempDir, uniqueId } from './helpers';

// The provider activities against a real local provider: a call shorter than QUIET_START_MS sends
// Temporal no heartbeat (each one is a write on the server), a longer one still heartbeats, so a
// hung call is cut by its heartbeat timeout as before.

let host: Host;
let activities: ReturnType<typeof createProviderActivities>;

beforeAll(async () => {
  host = await makeHost();
  const metrics = await WorkerMetrics.load(host.hostId, new FsFiguresStore(await tempDir('figures')));
  activities = createProviderActivities({
    hostId: host.hostId,
    provider: () => host.provider,
    metrics,
    hostPaths: { allowed: [] },
  });
});

/**
 * Runs `fn` as an activity; the heartbeats it sent Temporal, its result, and how many milliseconds
 * after the call began each beat was sent.
 */
async function beatsOf<T>(
  fn: (env: MockActivityEnvironment) => Promise<T>,
): Promise<{ beats: unknown[]; value: T; beatenAtMs: number[] }> {
  const env = new MockActivityEnvironment();
  const beats: unknown[] = [];
  const beatenAtMs: number[] = [];
  const began = Date.now();
  env.on('heartbeat', (details: unknown) => {
    beats.push(details);
    beatenAtMs.push(Date.now() - began);
  });
  const value = await fn(env);
  return { beats, value, beatenAtMs };
}

test('exec, release and resume calls send Temporal no heartbeat before QUIET_START_MS', async () => {
  await fc.assert(
    fc.asyncProperty(fc.constantFrom<PauseMode>('DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'), async (mode) => {
      const sandboxId = await host.sandbox();
      // The checkpoint is labelled with the Run's hashes, checked again when it is restored.
      const owner = {
        provider: 'local',
        ownerId: 'run-test',
        labels: { runhash: 'r', spechash: 's', policyhash: 'p' },
      };
      const exec = await beatsOf<ExecOutcome>((env) =>
        env.run(activities.execInSandbox, {
          ...owner,
          request: { sandboxId, fence: 1, jobId: uniqueId('job'), command: 'echo hi > f' },
        }),
      );
      expect(exec.value.exitCode).toBe(0);
      const release = await beatsOf<SandboxReleaseReceipt>((env) =>
        env.run(activities.releaseSandbox, {
          ...owner,
          request: { sandboxId, idempotencyKey: uniqueId('rel'), mode, fence: 2, reason: 'test' },
        }),
      );
      expect(release.value).toMatchObject({ sandboxId, mode, duplicate: false });
      const resumed = await beatsOf<ResumedExec>((env) =>
        env.run(activities.resumeAndExecInSandbox, {
          ...owner,
          bringBack: bringBackOf(mode, sandboxId, release.value),
          expect: { run: 'r', spec: 's', policy: 'p' },
          request: { sandboxId, fence: 3, jobId: uniqueId('job'), command: 'cat f' },
        }),
      );
      expect(resumed.value.outcome?.stdout).toBe('hi\n');
      // None before QUIET_START_MS: a call that ends sooner sends none (a loaded machine may make
      // one of these calls take longer; it may then beat, as the next test asks of a long call).
      for (const call of [exec, release, resumed]) {
        expect(call.beatenAtMs.filter((at) => at < QUIET_START_MS)).toEqual([]);
      }
    }),
    { numRuns: 3 },
  );
});

test('a call that runs past QUIET_START_MS heartbeats with its progress', async () => {
  const sandboxId = await host.sandbox();
  const seconds = (QUIET_START_MS + 2_500) / 1000;
  const { beats, value } = await beatsOf<ExecOutcome>((env) =>
    env.run(activities.execInSandbox, {
      provider: 'local',
      ownerId: 'run-test',
      request: { sandboxId, fence: 1, jobId: 'job-long', command: `sleep ${seconds}` },
    }),
  );
  expect(value.exitCode).toBe(0);
  expect(beats.length).toBeGreaterThan(0);
  expect(beats[0]).toMatchObject({ phase: 'running job job-long' });
});

/** Attach after a DETACH release, restore (from the checkpoint, if any) after the others. */
function bringBackOf(mode: PauseMode, sandboxId: string, receipt: SandboxReleaseReceipt): BringBack {
  if (mode === 'DETACH') return { op: 'attach', request: { sandboxId, fence: 3 } };
  return {
    op: 'restore',
    request: { sandboxId, fence: 3, ...(receipt.checkpoint ? { checkpoint: receipt.checkpoint } : {}) },
  };
}
