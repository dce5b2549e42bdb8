import { releasedView } from '../helpers/runs';
import { useStack, eventually, saw } from '../helpers/stack';

const stack = useStack();

const resource = async (runId: string) => saw(await stack.client.runs.resource(runId));

test('a CONTINUE background job blocks release until it ends, then the record is RELEASED', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        {
          exec: 'touch started && while [ ! -f finish ]; do sleep 0.1; done; echo finished > job.out',
          background: true,
          pauseBehavior: 'CONTINUE',
        },
        { exec: 'while [ ! -f started ]; do sleep 0.1; done' },
        { ask: 'continue?' },
        { expectFile: { path: 'job.out', content: 'finished\n' } },
      ],
    },
    sandbox: { provider: 'local' },
  });
  const blocked = await eventually(
    async () => {
      const view = await resource(runId);
      return view.record.state === 'RELEASE_BLOCKED' ? view : undefined;
    },
    30_000,
    'RELEASE_BLOCKED',
  );
  expect(blocked.record.blockedSince).toEqual(expect.any(String));
  expect(blocked.phase).toBe('SUSPENDED');
  expect((await stack.client.runs.get(runId)).status).toBe('WAITING');
  const provider = stack.workers.get('host-a')!.registry.get('local');
  expect(await provider.processCount(blocked.record.sandboxId)).toBeGreaterThan(0);

  // The job still runs inside the (unreleased) sandbox; let it finish.
  await provider.writeFile(
    { sandboxId: blocked.record.sandboxId, path: 'finish', content: Buffer.from('') },
    { ownerId: runId, hostId: 'host-a' },
  );
  const released = await releasedView(stack.client, runId, 30_000);
  expect(released.record.blockedSince).toBeUndefined();
  expect(await provider.processCount(released.record.sandboxId)).toBe(0);

  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  const output = await stack.temporal.workflow.getHandle(runId).result();
  expect(output).toEqual({ path: 'job.out', content: 'finished\n' });
});

test('an EXTERNAL job never blocks release, and a CANCEL job is cancelled', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        { exec: 'sleep 60', background: true, pauseBehavior: 'CONTINUE', executionAffinity: 'EXTERNAL' },
        { exec: 'sleep 60', background: true, pauseBehavior: 'CANCEL' },
        { ask: 'continue?' },
      ],
    },
    sandbox: { provider: 'local' },
  });
  const released = await releasedView(stack.client, runId, 30_000);
  expect(released.record.blockedSince).toBeUndefined();
  await stack.client.runs.cancel(runId);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect((await stack.client.runs.get(runId)).status).toBe('CANCELLED');
});
