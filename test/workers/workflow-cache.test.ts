import { ConfigError, loadConfig } from '../../common/config';
import { useStack, startStack, eventually } from '../helpers/stack';

// A waiting Run needs no cache slot: the worker keeps at most STASIS_MAX_CACHED_WORKFLOWS Runs, and a
// Run evicted while it waits replays its history when answered and goes on where it stopped.

const stack = useStack(() => startStack({ env: { STASIS_MAX_CACHED_WORKFLOWS: '2' } }));

const spec = (n: number) => ({
  agent: {
    driver: 'scripted',
    steps: [
      { writeFile: { path: 'n.txt', content: `${n}` } },
      { ask: `go on with ${n}?`, kind: 'input' },
      { expectFile: { path: 'n.txt', content: `${n}` } },
      { complete: n },
    ],
  },
  sandbox: { provider: 'local' },
});

test('with a cache of 2, five waiting Runs hold at most 2 cache slots, and each evicted Run completes when answered', async () => {
  const worker = stack.workers.get('host-a')!;
  const runIds: string[] = [];
  for (let n = 0; n < 5; n++) runIds.push((await stack.client.runs.start(spec(n))).runId);
  for (const runId of runIds) {
    await eventually(
      async () => (await stack.client.runs.resource(runId)).phase === 'SUSPENDED',
      60_000,
      `${runId} suspended`,
    );
  }
  expect(worker.cachedWorkflows()).toBeLessThanOrEqual(2);
  for (const [n, runId] of runIds.entries()) {
    await stack.client.runs.respond(runId, 'int-1', { input: `answer ${n}` });
    expect(worker.cachedWorkflows()).toBeLessThanOrEqual(2);
  }
  // Five open Runs, at most two cached: at least three were evicted and replayed to take their answer.
  for (const [n, runId] of runIds.entries()) expect(await stack.temporal.workflow.getHandle(runId).result()).toBe(n);
  expect((await stack.client.runs.get(runIds[0])).interactions[0]).toMatchObject({
    status: 'answered',
    response: { input: 'answer 0' },
  });
});

test.each(['0', '1', '-1', '00', 'many', '2.5', '10000000'])(
  'STASIS_MAX_CACHED_WORKFLOWS=%s is a configuration error naming it',
  (value) => {
    let error: unknown;
    try {
      loadConfig({ STASIS_MAX_CACHED_WORKFLOWS: value });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect(String((error as Error).message)).toMatch(
      /STASIS_MAX_CACHED_WORKFLOWS: must be a whole number of Runs from 2/,
    );
  },
);

test('STASIS_MAX_CACHED_WORKFLOWS defaults to 1000 and takes 2 (the smallest cache)', () => {
  expect(loadConfig({}).STASIS_MAX_CACHED_WORKFLOWS).toBe(1_000);
  expect(loadConfig({ STASIS_MAX_CACHED_WORKFLOWS: '2' }).STASIS_MAX_CACHED_WORKFLOWS).toBe(2);
});
