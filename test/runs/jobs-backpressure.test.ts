import { mkdtemp, stat, writeFile } from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import { Worker } from '@temporalio/worker';
import type { AgentAction, AgentDriver } from '../../drivers/api';
import { workflowBundle } from '../../workers/worker';
import { PATCH_RUN_BASELINE_4 } from '../../workflows/run-controller';
import { HISTORY_SIZE_HIGH_WATER_BYTES, RUN_ITEM_HISTORY_MAX_BYTES } from '../../workflows/lifecycle';
import { patchIds } from '../helpers/patches';
import { startStack, useStack } from '../helpers/stack';

// A Run whose agent keeps a background job running and keeps taking steps whose results are large
// cannot continue as new (not with a job running), so its history grew until Temporal terminated it at
// 50 MB and left its sandbox. Once its history, with room for what its running job may still add
// (RUN_ITEM_HISTORY_MAX_BYTES), reaches HISTORY_SIZE_HIGH_WATER_BYTES it takes no further step until the
// job ends; then it continues as new and goes on, every result delivered.
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

// Many background jobs, or children, ending together (an attack review's): each background job's result
// carried its output (two streams of 128 KiB of control characters, ~1.5 MiB of JSON) although the Run
// throws it away, and each child's completion carries its output (up to 2 MiB): 36 jobs or 27 children
// started in small steps (the history a few hundred KB) and ending together took the Run past 50 MB and
// Temporal terminated it. A background job's activity now returns no output, and the Run keeps room for
// what each running job and child may still add: it takes no step while its history and that room reach
// the high-water mark.
const FLOOD_JOBS = 36;
const FLOOD_STREAM = 128 * 1024;
/** Without the room kept, the history passes this on its way to 50 MiB: the test stops there. */
const FLOOD_TOO_FAR_BYTES = 45 * 1024 * 1024;

/** FLOOD_JOBS small steps each start a background job that waits for `release`, then a foreground job holds the loop until `release2`. */
const manyJobs: AgentDriver = {
  name: 'many-jobs',
  async step({ state, lastResult }) {
    const i = (state as { i: number } | undefined)?.i ?? 0;
    let action: AgentAction;
    if (i < FLOOD_JOBS) {
      const command =
        `until [ -e release ]; do sleep 0.2; done; head -c ${FLOOD_STREAM} /dev/zero | tr '\\0' '\\1'; ` +
        `head -c ${FLOOD_STREAM} /dev/zero | tr '\\0' '\\1' >&2`;
      action = { type: 'job', command, pauseBehavior: 'CANCEL', executionAffinity: 'SANDBOX', background: true };
    } else if (i === FLOOD_JOBS) {
      const command = 'touch holding; until [ -e release2 ]; do sleep 0.2; done; echo held';
      action = { type: 'job', command, pauseBehavior: 'CANCEL', executionAffinity: 'SANDBOX', background: false };
    } else action = { type: 'complete', output: { steps: i, foreground: (lastResult as { stdout?: string }).stdout } };
    return { action, state: { i: i + 1 } };
  },
};

const FLOOD_CHILDREN = 27;
/** Each child's output: ~2 MB of JSON (six bytes a control character), under Temporal's 2 MiB payload. */
const CHILD_OUTPUT = '\u0001'.repeat(340_000);
let releaseChildren: () => void = () => undefined;
const childrenReleased = new Promise<void>((resolve) => (releaseChildren = resolve));

const bigChild: AgentDriver = {
  name: 'child-big',
  async step() {
    await childrenReleased;
    return { action: { type: 'complete', output: CHILD_OUTPUT } as AgentAction, state: {} };
  },
};

/** FLOOD_CHILDREN spawns, then a foreground job holds the loop until `release2`. */
const parentSpawns: AgentDriver = {
  name: 'parent-spawns',
  async step({ state }) {
    const i = (state as { i: number } | undefined)?.i ?? 0;
    let action: AgentAction;
    if (i < FLOOD_CHILDREN) {
      action = {
        type: 'spawn',
        spec: { agent: { driver: 'child-big' }, sandbox: { provider: 'local' } },
      } as AgentAction;
    } else if (i === FLOOD_CHILDREN) {
      const command = 'touch holding; until [ -e release2 ]; do sleep 0.2; done';
      action = { type: 'job', command, pauseBehavior: 'CANCEL', executionAffinity: 'SANDBOX', background: false };
    } else action = { type: 'complete', output: { steps: i } };
    return { action, state: { i: i + 1 } };
  },
};

const stack = useStack(() => startStack({ worker: { drivers: [bigOutputs, manyJobs, bigChild, parentSpawns] } }));

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
 * Starts a Run of `driver` in an active workspace of its own (on the host, under STASIS_HOST_PATHS),
 * so the test can end its jobs from outside (a `release` file) and see what it leaves there.
 */
async function startInWorkspace(driver: string, prefix: string): Promise<{ runId: string; hostPath: string }> {
  const hostPath = path.join(await mkdtemp(path.join(os.tmpdir(), prefix)), 'ws');
  const { runId } = await stack.client.runs.start({
    agent: { driver },
    sandbox: { provider: 'local', workspace: { kind: 'active', hostPath } },
  });
  return { runId, hostPath };
}

/**
 * Starts a Run of bigOutputs and resolves once it says it waits for its job. Without backpressure its
 * history passes TOO_FAR_BYTES first: the Run is then cancelled and its job ended, so neither runs on.
 */
async function startWaiting() {
  const { runId, hostPath } = await startInWorkspace('big-outputs', 'stasis-backpressure-');
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
  expect(waitingFor).toMatch(/a running job or child Run to end \(job job-1\)/);
  // It holds: no step taken and no history written while it waits.
  const before = { steps: seenOf(runId).steps, length: (await handle.describe()).historyLength };
  await new Promise((r) => setTimeout(r, 2_000));
  const held = await handle.describe();
  expect({ steps: seenOf(runId).steps, length: held.historyLength }).toEqual(before);
  expect(held.historySize).toBeGreaterThanOrEqual(HISTORY_SIZE_HIGH_WATER_BYTES - RUN_ITEM_HISTORY_MAX_BYTES);
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
  expect(executions[0].historySize).toBeGreaterThanOrEqual(HISTORY_SIZE_HIGH_WATER_BYTES - RUN_ITEM_HISTORY_MAX_BYTES);
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

/** The activities the Run's current execution has under way: its running jobs (the agent's steps are local). */
async function pendingActivities(runId: string): Promise<number> {
  const described = await stack.temporal.workflow.getHandle(runId).describe();
  return described.raw.pendingActivities?.length ?? 0;
}

/**
 * Polls `check` every 250 ms (a check that throws, e.g. a query of a Run whose workflow task fails, is
 * not yet true); throws once the Run's history passes FLOOD_TOO_FAR_BYTES or it closes first.
 */
async function floodUntil(
  runId: string,
  what: string,
  check: () => Promise<boolean>,
  timeoutMs = 60_000,
): Promise<void> {
  const handle = stack.temporal.workflow.getHandle(runId);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const done = await check().catch(() => false);
    const described = await handle.describe();
    const size = described.historySize ?? 0;
    if (size > FLOOD_TOO_FAR_BYTES || described.status.name !== 'RUNNING' || Date.now() > deadline) {
      throw new Error(
        `before ${what}: ${described.status.name}, history ${size} bytes, ${described.historyLength} events`,
      );
    }
    if (done) return;
    await new Promise((r) => setTimeout(r, 250));
  }
}

test('background jobs ending together leave their output out of the history: the Run is not terminated and completes', async () => {
  const started = Date.now();
  const { runId, hostPath } = await startInWorkspace('many-jobs', 'stasis-jobs-flood-');
  const handle = stack.temporal.workflow.getHandle(runId);
  const running = () => pendingActivities(runId);
  try {
    // Room is kept for sixteen running jobs from a history this small: the Run says it waits for one to
    // end. (Without it, all of them start and the foreground job holds the loop.)
    let waitingFor: string | undefined;
    await floodUntil(runId, 'the background jobs all run or the Run waits', async () => {
      waitingFor = (await stack.client.runs.resource(runId)).waitingFor;
      return waitingFor !== undefined || (await running()) >= FLOOD_JOBS + 1;
    });
    const runningWhenReleased = await running();
    await writeFile(path.join(hostPath, 'release'), '');
    // Every background job ends, and the foreground one holds the loop.
    await floodUntil(runId, 'every background job ended', async () => {
      const jobIds = (await stack.client.runs.resource(runId)).waitingFor;
      if (jobIds !== undefined) return false;
      const holding = await stat(path.join(hostPath, 'holding')).then(
        () => true,
        () => false,
      );
      return holding && (await running()) === 1;
    });
    const held = await handle.describe();
    expect(held.status.name).toBe('RUNNING');
    // It had waited for one of sixteen running jobs to end before it started more.
    expect(waitingFor).toMatch(/a running job or child Run to end \(jobs job-1, job-2, .*job-16\)/);
    expect(runningWhenReleased).toBeLessThan(FLOOD_JOBS);
    // No output of theirs in the history: the 36 jobs added a few KB each, not ~1.5 MiB.
    expect(held.historySize).toBeLessThan(8 * 1024 * 1024);
    await writeFile(path.join(hostPath, 'release2'), '');
    // The foreground job's output still reaches the agent whole.
    await expect(handle.result()).resolves.toEqual({ steps: FLOOD_JOBS + 1, foreground: 'held\n' });
    const executions = await everyExecution(runId);
    expect(executions.map((e) => e.status)).toEqual([
      ...executions.slice(1).map(() => 'CONTINUED_AS_NEW'),
      'COMPLETED',
    ]);
    for (const e of executions) expect(e.historySize).toBeLessThan(FLOOD_TOO_FAR_BYTES);
    console.info(
      `jobs flood: ${(Date.now() - started) / 1000} s; executions ${JSON.stringify(executions.map((e) => [e.status, e.historySize]))}`,
    );
  } finally {
    await writeFile(path.join(hostPath, 'release'), '').catch(() => undefined);
    await writeFile(path.join(hostPath, 'release2'), '').catch(() => undefined);
    await handle.cancel().catch(() => undefined);
  }
}, 120_000);

test('children ending together: the parent keeps room for their outputs, is not terminated, and every child completes whole', async () => {
  const started = Date.now();
  const { runId, hostPath } = await startInWorkspace('parent-spawns', 'stasis-children-flood-');
  const handle = stack.temporal.workflow.getHandle(runId);
  const childIds = async () => (await stack.client.runs.get(runId)).childRunIds;
  const holding = () =>
    stat(path.join(hostPath, 'holding')).then(
      () => true,
      () => false,
    );
  try {
    // The parent waits for a child to end once the room for their outputs reaches its mark. (Without
    // it, it spawns them all and the foreground job holds the loop.)
    let waitingFor: string | undefined;
    await floodUntil(
      runId,
      'the children all run or the parent waits',
      async () => {
        waitingFor = (await stack.client.runs.resource(runId)).waitingFor;
        return waitingFor !== undefined || (await holding());
      },
      90_000,
    );
    const spawnedWhenReleased = (await childIds()).length;
    releaseChildren();
    // The rest are spawned (after the parent continues as new) and end; the foreground job holds the loop.
    await floodUntil(
      runId,
      'every child ended',
      async () => {
        const ids = await childIds();
        if (ids.length < FLOOD_CHILDREN || !(await holding())) return false;
        // Every child's completion has reached the parent's open execution (or the one that started it closed).
        const described = await handle.describe();
        if ((described.raw.pendingChildren?.length ?? 0) > 0) return false;
        const statuses = await Promise.all(
          ids.map(async (id) => (await stack.temporal.workflow.getHandle(id).describe()).status.name),
        );
        return statuses.every((st) => st === 'COMPLETED');
      },
      90_000,
    );
    // It had waited for one of its running children to end before it spawned more.
    expect(waitingFor).toMatch(/a running job or child Run to end \(child Runs /);
    expect(spawnedWhenReleased).toBeLessThan(FLOOD_CHILDREN);
    await writeFile(path.join(hostPath, 'release2'), '');
    await expect(handle.result()).resolves.toEqual({ steps: FLOOD_CHILDREN + 1 });
    const executions = await everyExecution(runId);
    expect(executions.map((e) => e.status)).toEqual([
      ...executions.slice(1).map(() => 'CONTINUED_AS_NEW'),
      'COMPLETED',
    ]);
    for (const e of executions) expect(e.historySize).toBeLessThan(FLOOD_TOO_FAR_BYTES);
    // Nothing lost: every child completed with its output whole, and the parent knows each ended
    // (reported by signal). A child's output lands in the history of the parent's execution that started
    // it if that execution is still open when it ends (one that continued as new meanwhile, as children
    // survive it, gets none: the parent never reads them); those that landed are whole.
    const ids = await childIds();
    expect(new Set(ids).size).toBe(FLOOD_CHILDREN);
    for (const id of ids) {
      const child = await stack.client.runs.get(id);
      expect({ status: child.status, whole: child.output === CHILD_OUTPUT }).toEqual({
        status: 'COMPLETED',
        whole: true,
      });
    }
    const known = new Set(ids);
    const outputs = executions.flatMap((e) =>
      (e.history.events ?? [])
        .map((ev) => ev.childWorkflowExecutionCompletedEventAttributes)
        .filter((a) => a != null && known.has(a.workflowExecution?.workflowId ?? ''))
        .map((a) => JSON.parse(Buffer.from(a!.result!.payloads![0].data!).toString('utf8')) as unknown),
    );
    for (const output of outputs) expect(output).toBe(CHILD_OUTPUT);
    console.info(
      `children flood: ${(Date.now() - started) / 1000} s; ${outputs.length} outputs in the parent's histories; executions ${JSON.stringify(executions.map((e) => [e.status, e.historySize]))}`,
    );
  } finally {
    releaseChildren();
    await writeFile(path.join(hostPath, 'release2'), '').catch(() => undefined);
    await handle.cancel().catch(() => undefined);
  }
}, 180_000);
