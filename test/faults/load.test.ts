import { readdirSync } from 'node:fs';
import * as path from 'node:path';
import { scanSandboxProcesses } from '../../providers/processes';
import { storedKeys, testS3 } from '../helpers/s3';
import { startStack, type TestStack } from '../helpers/stack';
import { failedWorkflowTasks, historyEvents, sleep, Tally, writeSummary } from './helpers';

// Area 7, load: RUNS concurrent Runs through a full cycle on one worker: write
// a file, ask, suspend (snapshot release to MinIO), answered after a random
// delay (some while their release is still running, most once released),
// restore, check the file, complete. 0 lost (every Run completes with its
// output), 0 stuck (all within the deadline), 0 workflow task failures, and
// nothing left on the host: no process, no workspace, no checkpoint in the store.
// The 500 concurrent Runs (STASIS_LOAD_RUNS sets another number).

const RUNS = Number(process.env.STASIS_LOAD_RUNS ?? 500);
/** Random answer delay after the Run is seen waiting. */
const MAX_ANSWER_DELAY_MS = 5_000;
const DEADLINE_MS = 25 * 60_000;

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

/** Runs of this test (`prefix`) the visibility store shows waiting for an answer. */
async function waitingRuns(prefix: string): Promise<string[]> {
  const ids: string[] = [];
  const query = `WorkflowId STARTS_WITH '${prefix}' AND StasisStatus = 'WAITING' AND ExecutionStatus = 'Running'`;
  for await (const wf of stack.temporal.workflow.list({ query, pageSize: 1000 })) ids.push(wf.workflowId);
  return ids;
}

/** Its result, or a "stuck" error at the deadline. */
async function resultBy(runId: string, deadline: number): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  const stuck = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${runId} stuck past the deadline`)), Math.max(0, deadline - Date.now()));
  });
  return Promise.race([stack.temporal.workflow.getHandle(runId).result(), stuck]).finally(() => clearTimeout(timer));
}

test(
  `${RUNS} concurrent Runs through ask → suspend → answer → restore → complete: 0 lost, 0 stuck, nothing left`,
  async () => {
    const started = Date.now();
    const deadline = started + DEADLINE_MS;
    const prefix = `faults-load-${started.toString(36)}-`;
    const runIds = Array.from({ length: RUNS }, (_, i) => `${prefix}${i}`);
    for (let i = 0; i < runIds.length; i += 50) {
      await Promise.all(
        runIds.slice(i, i + 50).map(async (runId) => {
          tally.start(runId, `run ${runId}`);
          await stack.client.runs.start({ ...spec(runId), runId });
        }),
      );
    }
    // One visibility query a second finds the waiting Runs (a query per Run would load the worker
    // as much as the Runs do); each is answered after its own random delay.
    const answered = new Map<string, Promise<unknown>>();
    while (answered.size < RUNS && Date.now() < deadline) {
      for (const runId of await waitingRuns(prefix)) {
        if (answered.has(runId)) continue;
        answered.set(
          runId,
          sleep(Math.random() * MAX_ANSWER_DELAY_MS).then(() =>
            stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }),
          ),
        );
      }
      await sleep(1_000);
    }
    const outcomes = await Promise.allSettled(
      runIds.map(async (runId) => {
        if (!answered.has(runId)) throw new Error(`${runId} never waited`);
        await answered.get(runId);
        expect(await resultBy(runId, deadline)).toEqual({ tag: runId });
      }),
    );
    durationMs = Date.now() - started;
    const failures = outcomes.flatMap((o, i) => (o.status === 'rejected' ? [`${runIds[i]}: ${String(o.reason)}`] : []));
    expect(failures).toEqual([]);

    for (let i = 0; i < runIds.length; i += 10) {
      await Promise.all(
        runIds.slice(i, i + 10).map(async (runId) => {
          const snapshot = await stack.client.runs.get(runId);
          const events = await historyEvents(stack.temporal, runId);
          if (
            snapshot.status === 'COMPLETED' &&
            snapshot.interactions[0]?.status === 'answered' &&
            failedWorkflowTasks(events).length === 0
          )
            tally.ok(runId);
        }),
      );
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
    for (const runId of runIds) checkpointsLeft += (await storedKeys(s3, `${runId}-sbx`)).length;
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
