import { startStack, type TestStack } from '../helpers/stack';

// A worker's run() reconciles its host before its pollers start. A shutdown asked for in that
// window found both Temporal workers not yet RUNNING, skipped them, and they then polled forever:
// the shutdown never resolved (test/runs/expiry.test.ts hung on it under load).

let stack: TestStack;
beforeAll(async () => {
  stack = await startStack({ startWorker: false });
});
afterAll(async () => {
  await stack?.stop();
});

test('a worker asked to stop right after it starts, while it still reconciles its host, stops', async () => {
  const worker = await stack.startWorker('host-quick');
  await stack.stopWorker('host-quick');
  await expect(worker.run()).resolves.toBeUndefined();
  expect(stack.workers.has('host-quick')).toBe(false);
}, 60_000);
