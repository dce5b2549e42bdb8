import type { AgentDriver } from '../../drivers/api';
import { eventually, saw, startStack, useStack } from '../helpers/stack';

// An agent step (an LLM call) may take minutes: the step heartbeats, so it is neither timed out
// after its 1-minute heartbeat timeout nor started again, and it ends when its activity is
// cancelled, so a worker shutting down is not held by a driver that never answers.

let slowCalls = 0;
const slow: AgentDriver = {
  name: 'slow',
  async step({ state }) {
    if (state === undefined) {
      slowCalls += 1;
      await new Promise((r) => setTimeout(r, 75_000));
      return { action: { type: 'complete', output: 'thought long' }, state: 1 };
    }
    return { action: { type: 'complete', output: 'again' }, state: 2 };
  },
};

let foreverStarted = false;
const forever: AgentDriver = {
  name: 'forever',
  async step() {
    foreverStarted = true;
    return new Promise(() => undefined);
  },
};

const stack = useStack(() => startStack({ worker: { drivers: [slow, forever] } }));

test('a driver step longer than the heartbeat timeout runs once and its answer is taken', async () => {
  const { runId } = await stack.client.runs.start({ agent: { driver: 'slow' }, sandbox: { provider: 'local' } });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('thought long');
  expect(slowCalls).toBe(1);
}, 240_000);

test('a worker stopping while a driver step never answers stops (the step is cancelled)', async () => {
  const { runId } = await stack.client.runs.start({ agent: { driver: 'forever' }, sandbox: { provider: 'local' } });
  await eventually(async () => foreverStarted, 60_000, 'the step under way');
  expect(saw(await stack.client.runs.get(runId)).status).toBe('RUNNING');
  let timer: NodeJS.Timeout | undefined;
  const stopped = await Promise.race([
    stack.stopWorker('host-a').then(() => 'stopped'),
    new Promise((r) => (timer = setTimeout(() => r('still running after 60 s'), 60_000))),
  ]);
  clearTimeout(timer);
  expect(stopped).toBe('stopped');
  await stack.startWorker('host-a');
  await stack.client.runs.cancel(runId);
}, 240_000);
