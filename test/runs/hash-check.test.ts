import { readFile, writeFile } from 'node:fs/promises';
import { sandboxPaths } from '../../providers/sandbox-state';
import { checkpointKeys, testS3 } from '../helpers/s3';
import { hostDataDir } from '../helpers/hosts';
import { releasedView } from '../helpers/runs';
import { useStack } from '../helpers/stack';

const s3 = testS3();
const stack = useStack();

/**
 * Starts a Run that writes a file, asks, then would exec; once it is released, rewrites the
 * labels its dormant copy on the host records (as a copy of another spec, or of no spec, would
 * have) and answers. Returns the Run and its released view.
 */
async function answeredWithLabels(edit: (labels: Record<string, string>) => Record<string, string>) {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ writeFile: { path: 'f', content: 'x' } }, { ask: 'go?' }, { exec: 'echo should not run' }],
    },
    sandbox: { provider: 'local' },
  });
  const view = await releasedView(stack.client, runId, 30_000);
  const { stateFile } = sandboxPaths(hostDataDir(stack, 'host-a'), view.record.sandboxId);
  const state = JSON.parse(await readFile(stateFile, 'utf8')) as { dormant: { labels: Record<string, string> } };
  state.dormant.labels = edit(state.dormant.labels);
  await writeFile(stateFile, JSON.stringify(state));
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  return { runId, view };
}

test('a checkpoint taken under another spec fails the resume with RESUME_HASH_MISMATCH and releases compute, keeping the checkpoint', async () => {
  // The dormant copy on the host claims to belong to another spec.
  const { runId, view } = await answeredWithLabels((labels) => ({ ...labels, spechash: '0'.repeat(64) }));
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('FAILED');
  expect(snapshot.error).toMatchObject({ code: 'RESUME_HASH_MISMATCH', message: expect.stringContaining('spec') });
  const after = await stack.client.runs.resource(runId);
  expect(after.record.state).toBe('RELEASED');
  expect(await stack.workers.get('host-a')!.registry.get('local').processCount(view.record.sandboxId)).toBe(0);
  // Nothing lost: the workspace's checkpoints stay in the store.
  expect((await checkpointKeys(s3, view.record.sandboxId)).length).toBeGreaterThanOrEqual(1);
  // The job after the answer never ran.
  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  const execs = (history.events ?? []).filter(
    (e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'execInSandbox',
  );
  expect(execs).toEqual([]);
});

test('a checkpoint that records no hashes fails the resume with RESUME_HASH_MISMATCH (the workflow never compares its own copies only)', async () => {
  const { runId } = await answeredWithLabels(() => ({}));
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect((await stack.client.runs.get(runId)).error).toMatchObject({
    code: 'RESUME_HASH_MISMATCH',
    message: expect.stringContaining('run, spec, policy'),
  });
});
