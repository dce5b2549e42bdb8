import { WorkflowUpdateStage } from '@temporalio/client';
import { freePort } from '../../platform/servers';
import type { ProviderDeps, SandboxProvider } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { suspendRunUpdate } from '../../workflows/definitions';
import { eventually, saw, startStackOnOwnTemporal, unprintedWorkerLogs, useStack } from '../helpers/stack';

// Continue-as-new happens between a Run's steps, when Temporal suggests it (here after 40 events).
// It waited for two things that may never come, holding the Run where it was, its compute
// included: a webhook receiver that is down (its deliveries retry for a week), and the handler of a
// suspend asked for meanwhile (which waits for the Run to suspend). Found by a lifecycle attack review.

unprintedWorkerLogs.push(/webhook/);

/** A restore that takes its time when asked to, so a suspend can come while it runs. */
let slowRestores = false;
let restoreStarted = false;
const slow = (deps: ProviderDeps): SandboxProvider => {
  const local = createLocalProvider(deps, { name: 'slow' });
  return {
    ...local,
    async restore(request, context) {
      if (slowRestores) {
        restoreStarted = true;
        for (let i = 0; i < 30; i++) {
          context.signal?.throwIfAborted();
          context.heartbeat?.();
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      }
      return local.restore(request, context);
    },
  };
};

// Nothing listens on the webhook's port: every delivery fails and is retried.
const stack = useStack(async () =>
  startStackOnOwnTemporal(40, {
    env: { STASIS_WEBHOOK_URL: `http://127.0.0.1:${await freePort()}/hooks` },
    worker: { providers: [slow] },
  }),
);

const ASKS = 8;

async function startAsker(provider: string): Promise<string> {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        { writeFile: { path: 'notes.txt', content: 'kept' } },
        ...Array.from({ length: ASKS }, (_, i) => ({ ask: `q${i + 1}?` })),
        { exec: 'cat notes.txt' },
      ],
    },
    sandbox: { provider },
    policy: { pauseMode: 'SNAPSHOT_AND_TERMINATE' },
  });
  return runId;
}

const asked = (runId: string, id: string) =>
  eventually(
    async () => {
      const shown = saw(await stack.client.runs.get(runId));
      return shown.interactions.some((i) => i.id === id && i.status === 'pending') ? shown : undefined;
    },
    60_000,
    `${runId} to ask ${id}`,
  );

/** The Run's own end (its workflow closes once the receiver, down here, has its deliveries). */
const completed = (runId: string) =>
  eventually(
    async () => {
      const shown = saw(await stack.client.runs.get(runId));
      if (shown.status !== 'COMPLETED') return undefined;
      expect(shown.output).toMatchObject({ stdout: 'kept' });
      return true;
    },
    60_000,
    `${runId} to complete`,
  );

test('a Run continues as new and goes on asking while the webhook receiver is down', async () => {
  const runId = await startAsker('local');
  const handle = stack.temporal.workflow.getHandle(runId);
  const executions = new Set<string>();
  for (let i = 1; i <= ASKS; i++) {
    await asked(runId, `int-${i}`);
    executions.add((await handle.describe()).runId);
    await stack.client.runs.respond(runId, `int-${i}`, { decision: 'approve' });
  }
  expect(executions.size).toBeGreaterThan(1);
  await completed(runId);
});

test('a suspend asked for while continue-as-new brings the sandbox back is taken, and the Run goes on after a resume', async () => {
  const runId = await startAsker('slow');
  const handle = stack.temporal.workflow.getHandle(runId);
  let suspendedAt: number | undefined;
  for (let i = 1; i <= ASKS; i++) {
    await asked(runId, `int-${i}`);
    if (suspendedAt === undefined && (await handle.describe()).historyLength >= 40) {
      // This answer's step is where the Run continues as new, bringing its sandbox back first.
      slowRestores = true;
      await stack.client.runs.respond(runId, `int-${i}`, { decision: 'approve' });
      await eventually(async () => restoreStarted || undefined, 30_000, 'the restore to start');
      const suspending = await handle.startUpdate(suspendRunUpdate, { waitForStage: WorkflowUpdateStage.ACCEPTED });
      // It deadlocked here: continue-as-new waited for this handler, the handler for the suspension.
      await expect(suspending.result()).resolves.toMatchObject({ status: 'RUNNING' });
      expect(saw(await stack.client.runs.resource(runId)).phase).toBe('SUSPENDED');
      slowRestores = false;
      await stack.client.runs.resume(runId);
      suspendedAt = i;
      continue;
    }
    await stack.client.runs.respond(runId, `int-${i}`, { decision: 'approve' });
  }
  expect(suspendedAt).toBeDefined();
  await completed(runId);
});
