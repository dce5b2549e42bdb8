import { readdirSync } from 'node:fs';
import * as path from 'node:path';
import { scanSandboxProcesses } from '../../providers/processes';
import { checkpointKeys, testS3 } from '../helpers/s3';
import { startStack, type TestStack } from '../helpers/stack';
import { failedWorkflowTasks, historyEvents, sleep, Tally, writeSummary } from './helpers';

// Area 7, load: RUNS concurrent Runs through a full cycle on one worker: write
// a file, ask, suspend (snapshot release to MinIO), answered after a random
// delay (some while their release is still running, most once released),
// restore, check the file, complete. 0 lost (every Run completes with its
// output), 0 stuck (all within the deadline), 0 workflow task failures, and
// nothing left on the host: no process, no workspace. The figure is
// 500 concurrent Runs; on the 2-core CI machine, which shares its cores with
// Temporal, MinIO and the test itself, RUNS is sized to finish in minutes.

const RUNS = 100;
/** Random answer delay after the Run is seen waiting. */
const MAX_ANSWER_DELAY_MS = 5_000;
const DEADLINE_MS = 8 * 60_000;

const tally = new Tally();
const s3 = testS3();
let stack: TestStack;
let checkpointsLeft = -1;
let durationMs = 0;
/** Counted after the Runs, before the assertions (so a failing run still reports them). */
let leftover = { processes: -1, workspaces: -1 };

beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack?.stop();
});

const spec = (tag: string) => ({
  agent: {
    driver: 'scripted',
    steps: [
      { writeFile: { path: 'work/state.txt', content: `state of ${tag}` } },
      { ask: `approve ${tag}?` },
      { expectFile: { path: 'work/state.txt', content: `state of ${tag}` } },
      { complete: { tag } },
    ],
  },
  sandbox: { provider: 'local' },
});

/** Waits (polling gently: RUNS of these run at once) until the Run waits, then answers it after a random delay. */
async function cycle(runId: string, deadline: number): Promise<void> {
  for (;;) {
    if (Date.now() > deadline) throw new Error(`${runId} never waited`);
    await sleep(2_000 + Math.random() * 2_000);
    const snapshot = await stack.client.runs.get(runId).catch(() => undefined);
    if (snapshot?.status === 'WAITING') break;
  }
  await sleep(Math.random() * MAX_ANSWER_DELAY_MS);
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  let timer: NodeJS.Timeout | undefined;
  const stuck = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${runId} stuck past the deadline`)), Math.max(0, deadline - Date.now()));
  });
  const output = await Promise.race([stack.temporal.workflow.getHandle(runId).result(), stuck]).finally(() =>
    clearTimeout(timer),
  );
  expect(output).toEqual({ tag: runId });
}

test(
  `${RUNS} concurrent Runs through ask → suspend → answer → restore → complete: 0 lost, 0 stuck, nothing left`,
  async () => {
    const started = Date.now();
    const deadline = started + DEADLINE_MS;
    const stamp = started.toString(36);
    const runIds = Array.from({ length: RUNS }, (_, i) => `faults-load-${i}-${stamp}`);
    await Promise.all(
      runIds.map(async (runId) => {
        tally.start(runId, `run ${runId}`);
        await stack.client.runs.start({ ...spec(runId), runId });
      }),
    );
    const outcomes = await Promise.allSettled(runIds.map((runId) => cycle(runId, deadline)));
    durationMs = Date.now() - started;
    const failures = outcomes.flatMap((o, i) => (o.status === 'rejected' ? [`${runIds[i]}: ${String(o.reason)}`] : []));
    expect(failures).toEqual([]);

    for (const runId of runIds) {
      const snapshot = await stack.client.runs.get(runId);
      const events = await historyEvents(stack.temporal, runId);
      if (
        snapshot.status === 'COMPLETED' &&
        snapshot.interactions[0]?.status === 'answered' &&
        failedWorkflowTasks(events).length === 0
      )
        tally.ok(runId);
    }
    // Nothing left on the host: no sandbox process, no workspace directory.
    const hostDir = path.join(stack.config.STASIS_DATA_DIR, 'hosts', 'host-a', 'sandboxes');
    const processes = [...(await scanSandboxProcesses('host-a')).keys()].filter((id) => id.startsWith('faults-load-'));
    const workspaces = readdirSync(hostDir).filter((name) => name.startsWith('faults-load-'));
    leftover = { processes: processes.length, workspaces: workspaces.length };
    expect(processes).toEqual([]);
    expect(workspaces).toEqual([]);
    // A completed Run destroyed its sandbox, and with it every checkpoint.
    checkpointsLeft = 0;
    for (const runId of runIds) checkpointsLeft += (await checkpointKeys(s3, `${runId}-sbx`)).length;
    expect(checkpointsLeft).toBe(0);
  },
  DEADLINE_MS + 120_000,
);

test('summary: 0 lost, 0 stuck, 0 left over', () => {
  writeSummary('load', tally, {
    concurrent_runs: RUNS,
    seconds: Math.round(durationMs / 1000),
    stuck: tally.lost,
    leftover_processes: leftover.processes,
    leftover_workspaces: leftover.workspaces,
    checkpoints_left_in_store: checkpointsLeft,
  });
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBe(RUNS);
  expect(leftover).toEqual({ processes: 0, workspaces: 0 });
});
