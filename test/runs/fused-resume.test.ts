import { existsSync } from 'node:fs';
import * as path from 'node:path';
import type { StepShape } from '../../common/schemas';
import { sandboxPaths } from '../../providers/sandbox-state';
import { evictDormantCopies, hostDataDir } from '../helpers/hosts';
import { checkpointKeys, moveAside, testS3 } from '../helpers/s3';
import { releasedView } from '../helpers/runs';
import { eventually, useStack, startStack } from '../helpers/stack';

// A resume fused with the job after it (resumeAndExecInSandbox) fails as a plain resume fails:
// the same Run, once resuming for a job (fused) and once for a file write (a resume of its own),
// with its checkpoint away from the store, ends the same way, its sandbox rolled back to RELEASED
// with its checkpoint, and the job never ran.

const s3 = testS3();
const stack = useStack(() => startStack({ hostId: 'host-a' }));

/** Starts a Run that writes a file, asks, then takes `next`; answers it once released with its checkpoint away. */
async function failedResume(next: StepShape) {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ exec: 'echo keep > notes.txt' }, { ask: 'go on?' }, next, { complete: 'done' }],
    },
    sandbox: { provider: 'local' },
  });
  const released = await releasedView(stack.client, runId, 60_000);
  const { sandboxId } = released.record;
  // No dormant copy on the host, and the checkpoint away from the store: the restore cannot succeed.
  expect(await evictDormantCopies(stack)).toContain(sandboxId);
  const [key] = await checkpointKeys(s3, sandboxId);
  const putBack = await moveAside(s3, key);
  try {
    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  } finally {
    await putBack();
  }
  const snapshot = await stack.client.runs.get(runId);
  const after = await stack.client.runs.resource(runId);
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  const scheduled = (history.events ?? []).flatMap(
    (e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? [],
  );
  const processes = await stack.workers.get('host-a')!.registry.get('local').processCount(sandboxId);
  return { released, snapshot, after, scheduled, processes };
}

test('a fused resume whose restore fails ends the Run as a failed resume of its own does, the sandbox rolled back to RELEASED', async () => {
  const fused = await failedResume({ exec: 'cat notes.txt' });
  const plain = await failedResume({ writeFile: { path: 'other.txt', content: 'x' } });
  // The job's resume was fused; the file write's was not.
  expect(fused.scheduled).toContain('resumeAndExecInSandbox');
  expect(fused.scheduled.filter((name) => name === 'execInSandbox')).toHaveLength(1); // the first exec only
  expect(plain.scheduled).toContain('restoreSandbox');
  expect(plain.scheduled).not.toContain('resumeAndExecInSandbox');
  for (const run of [fused, plain]) {
    expect(run.snapshot.status).toBe('FAILED');
    expect(run.after.record.state).toBe('RELEASED');
    expect(run.after.record.checkpoint).toEqual(run.released.record.checkpoint);
    expect(run.after.record.fence).toBeGreaterThan(run.released.record.fence);
    expect(run.processes).toBe(0);
  }
  // Exactly as the plain resume: same error, same record left behind.
  const outcome = (run: typeof fused) => ({
    error: run.snapshot.error?.code,
    state: run.after.record.state,
    // Named after the activity that failed (restoreSandbox or resumeAndExecInSandbox), then the same words.
    lastError: run.after.record.lastError?.replace(/^\w+: /, '').replace(/checkpoints\/[^ ]+/g, '<checkpoint>'),
    fenceRaisedBy: run.after.record.fence - run.released.record.fence,
  });
  expect(outcome(fused)).toEqual(outcome(plain));
});

test('a Run cancelled while the job of a fused resume runs ends CANCELLED (it ended FAILED), its compute released', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ exec: 'echo keep > notes.txt' }, { ask: 'go on?' }, { exec: 'touch job-started; sleep 60' }],
    },
    sandbox: { provider: 'local' },
  });
  const released = await releasedView(stack.client, runId, 60_000);
  const { sandboxId } = released.record;
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  const started = path.join(sandboxPaths(hostDataDir(stack, 'host-a'), sandboxId).workspace, 'job-started');
  await eventually(async () => (existsSync(started) ? true : undefined), 60_000, 'the fused job to run');
  await stack.client.runs.cancel(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect((await stack.temporal.workflow.getHandle(runId).describe()).status.name).toBe('CANCELLED');
  expect((await stack.client.runs.get(runId)).status).toBe('CANCELLED');
  // Its compute released, its workspace kept (a cancelled Run's).
  expect((await stack.client.runs.resource(runId)).record.state).toBe('RELEASED');
  expect(await stack.workers.get('host-a')!.registry.get('local').processCount(sandboxId)).toBe(0);
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  const scheduled = (history.events ?? []).flatMap(
    (e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? [],
  );
  expect(scheduled).toContain('resumeAndExecInSandbox');
});
