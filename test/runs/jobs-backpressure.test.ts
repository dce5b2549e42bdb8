import { mkdtemp, writeFile } from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import { Worker } from '@temporalio/worker';
import type { AgentAction, AgentDriver } from '../../drivers/api';
import { workflowBundle } from '../../workers/worker';
import { PATCH_RUN_BASELINE_4 } from '../../workflows/run-controller';
import { HISTORY_SIZE_HIGH_WATER_BYTES } from '../../workflows/lifecycle';
import { patchIds } from '../helpers/patches';
import { startStack, useStack } from '../helpers/stack';

// A Run whose agent keeps a background job running and keeps taking steps whose results are large
// cannot continue as new (not with a job running), so its history grew until Temporal terminated it at
// 50 MB and left its sandbox. Past HISTORY_SIZE_HIGH_WATER_BYTES it takes no further step until its
// running jobs end; then it continues as new and goes on, every result delivered.
//
// The history is made as cheaply as it can be: each step's result is 128 KiB of control characters (each
// six bytes of JSON, ~786 KB), once in the exec's completion and once in the next step's input (this
// driver's steps are activities), so ~1.6 MB a step and ~21 steps to the high-water mark.

const BIG_STEPS = 30;
const BIG_BYTES = 128 * 1024;
/** Each big step's whole stdout: BIG_BYTES control characters U+0001. */
const ONES = '\u0001'.repeat(BIG_BYTES);
/** Without backpressure the history passes this on its way to Temporal's 50 MB: the test stops there. */
const TOO_FAR_BYTES = 36 * 1024 * 1024;

/** The steps the driver took in each Run, and the results it checked whole (the test reads them: same process). */
const seenBy = new Map<string, { steps: number; wholeResults: number }>();
const seenOf = (runId: string) => seenBy.get(runId) ?? { steps: 0, wholeResults: 0 };

/** Step 0 starts a background job that runs until `release` appears in the workspace; then BIG_STEPS big outputs. */
const bigOutputs: AgentDriver = {
  name: 'big-outputs',
  async step({ runId, state, lastResult }) {
    const i = (state as { i: number } | undefined)?.i ?? 0;
    const seen = seenOf(runId);
    seenBy.set(runId, seen);
    seen.steps = i + 1;
    const result = lastResult as { exitCode?: number; stdout?: string } | undefined;
    if (i >= 2 && result?.exitCode === 0 && result.stdout === ONES) seen.wholeResults += 1;
    let action: AgentAction;
    if (i === 0) {
      const command = 'until [ -e release ]; do sleep 0.1; done';
      action = { type: 'job', command, pauseBehavior: 'CANCEL', executionAffinity: 'SANDBOX', background: true };
    } else if (i <= BIG_STEPS) {
      const command = `head -c ${BIG_BYTES} /dev/zero | tr '\\0' '\\1'`;
      action = { type: 'job', command, pauseBehavior: 'CANCEL', executionAffinity: 'SANDBOX', background: false };
    } else action = { type: 'complete', output: { steps: i, wholeResults: seen.wholeResults } };
    return { action, state: { i: i + 1 } };
  },
};

const stack = useStack(() => startStack({ worker: { drivers: [bigOutputs] } }));

/** Every execution of `workflowId` with its history, oldest first (histories past gRPC's default 4 MB message). */
async function everyExecution(workflowId: string) {
  const connection = await Connection.connect({
    ...stack.config.temporal.connectionOptions,
    channelArgs: { 'grpc.max_receive_message_length': 256 * 1024 * 1024 },
  });
  try {
    const client = new Client({ connection, namespace: stack.config.TEMPORAL_NAMESPACE });
    const listed: { runId: string; startMs: number }[] = [];
    for await (const e of client.workflow.list({ query: `WorkflowId = '${workflowId}'` }))
      listed.push({ runId: e.runId, startMs: e.startTime.getTime() });
    listed.sort((a, b) => a.startMs - b.startMs);
    const out: { status: string; historySize: number; history: temporal.api.history.v1.IHistory }[] = [];
    for (const { runId } of listed) {
      const handle = client.workflow.getHandle(workflowId, runId);
      const described = await handle.describe();
      out.push({
        status: described.status.name,
        historySize: described.historySize ?? 0,
        history: await handle.fetchHistory(),
      });
    }
    return out;
  } finally {
    await connection.close();
  }
}

/** The Run's `waitingFor` once it says it waits; throws once its history passes TOO_FAR_BYTES (or it closes) first. */
async function untilWaiting(runId: string): Promise<string> {
  const handle = stack.temporal.workflow.getHandle(runId);
  for (;;) {
    const described = await handle.describe();
    const size = described.historySize ?? 0;
    if (size > TOO_FAR_BYTES || described.status.name !== 'RUNNING') {
      throw new Error(
        `the Run went on taking steps with its background job running: ${described.status.name}, ` +
          `history ${size} bytes after ${seenOf(runId).steps} steps`,
      );
    }
    const { waitingFor } = await stack.client.runs.resource(runId);
    if (waitingFor !== undefined) return waitingFor;
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * Starts a Run of bigOutputs and resolves once it says it waits for its job. Without backpressure its
 * history passes TOO_FAR_BYTES first: the Run is then cancelled and its job ended, so neither runs on.
 */
async function startWaiting() {
  // An active workspace (on the host, under STASIS_HOST_PATHS) lets the test end the job from outside.
  const hostPath = path.join(await mkdtemp(path.join(os.tmpdir(), 'stasis-backpressure-')), 'ws');
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'big-outputs' },
    sandbox: { provider: 'local', workspace: { kind: 'active', hostPath } },
  });
  const handle = stack.temporal.workflow.getHandle(runId);
  const release = () => writeFile(path.join(hostPath, 'release'), '');
  const waitingFor = await untilWaiting(runId).catch(async (err: unknown) => {
    await release();
    await handle.cancel().catch(() => undefined);
    throw err;
  });
  return { runId, handle, release, waitingFor };
}

test('a Run with a background job running waits to take steps past its history high-water mark, then continues as new once the job ends', async () => {
  const started = Date.now();
  const { runId, handle, release, waitingFor } = await startWaiting();
  expect(waitingFor).toMatch(/background job job-1 to end before it continues as new/);
  // It holds: no step taken and no history written while it waits.
  const before = { steps: seenOf(runId).steps, length: (await handle.describe()).historyLength };
  await new Promise((r) => setTimeout(r, 2_000));
  const held = await handle.describe();
  expect({ steps: seenOf(runId).steps, length: held.historyLength }).toEqual(before);
  expect(held.historySize).toBeGreaterThanOrEqual(HISTORY_SIZE_HIGH_WATER_BYTES);
  expect(held.historySize).toBeLessThan(TOO_FAR_BYTES);
  expect(seenOf(runId).steps).toBeLessThan(BIG_STEPS + 1);

  // The job ends: the Run continues as new and completes, having delivered every result whole.
  await release();
  await expect(handle.result()).resolves.toEqual({ steps: BIG_STEPS + 1, wholeResults: BIG_STEPS });
  expect((await stack.client.runs.resource(runId)).waitingFor).toBeUndefined();

  // Every execution, oldest first: the first waited and continued as new (the later ones too, with no job
  // running: Temporal suggests it from 4 MB); none was terminated, the last completed, and none recorded a
  // marker but the baseline's.
  const executions = await everyExecution(runId);
  expect(executions.map((e) => e.status)).toEqual([...executions.slice(1).map(() => 'CONTINUED_AS_NEW'), 'COMPLETED']);
  expect(executions[0].historySize).toBeGreaterThanOrEqual(HISTORY_SIZE_HIGH_WATER_BYTES);
  for (const e of executions) expect(e.historySize).toBeLessThan(TOO_FAR_BYTES);
  for (const e of executions) expect(patchIds(e.history.events ?? [])).toEqual([PATCH_RUN_BASELINE_4]);
  // The execution that waited replays against the workflow code.
  await Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, executions[0].history, runId);
  console.info(
    `jobs backpressure: ${(Date.now() - started) / 1000} s; executions ${JSON.stringify(executions.map((e) => [e.status, e.historySize]))}`,
  );
}, 180_000);

test('a suspend asked for while the Run waits for its job is taken (it cancels the job); resumed, the Run continues as new and completes', async () => {
  const { runId, handle, release } = await startWaiting();
  try {
    // Taken at once: the suspend must not wait for the job, which ends only when it is cancelled.
    let timer: NodeJS.Timeout | undefined;
    const suspended = await Promise.race([
      stack.client.runs.suspend(runId),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error('the suspend was not taken while the Run waited for its job')),
          30_000,
        );
      }),
    ]).finally(() => clearTimeout(timer));
    expect(suspended.status).toBe('RUNNING');
    const view = await stack.client.runs.resource(runId);
    expect(view).toMatchObject({ phase: 'SUSPENDED', suspension: { reason: 'MANUAL' } });
    expect(view.waitingFor).toBeUndefined();
    await stack.client.runs.resume(runId);
    await expect(handle.result()).resolves.toEqual({ steps: BIG_STEPS + 1, wholeResults: BIG_STEPS });
    const statuses: string[] = [];
    for await (const wf of stack.temporal.workflow.list({ query: `WorkflowId = '${runId}'` }))
      statuses.push(wf.status.name);
    expect(statuses).toContain('CONTINUED_AS_NEW');
    expect(statuses.filter((st) => st !== 'CONTINUED_AS_NEW')).toEqual(['COMPLETED']);
  } finally {
    await release();
  }
}, 180_000);
