import { useStack } from '../helpers/stack';

const stack = useStack();

test('a scripted Run provisions a local sandbox, runs an exec step and completes with its output', async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ exec: 'echo hello from $(pwd | xargs basename)' }] },
    sandbox: { provider: 'local' },
  });
  const output = await stack.temporal.workflow.getHandle(runId).result();
  expect(output).toMatchObject({ exitCode: 0, stdout: 'hello from workspace\n' });
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot).toMatchObject({ runId, status: 'COMPLETED', output: { stdout: 'hello from workspace\n' } });
  const resource = await stack.client.runs.resource(runId);
  expect(resource.record.state).toBe('DESTROYED');
  const provider = stack.workers.get('host-a')!.registry.get('local');
  expect(await provider.processCount(resource.record.sandboxId)).toBe(0);
});
