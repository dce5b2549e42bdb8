import { mkdtemp } from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { temporal } from '@temporalio/proto';
import type { PauseMode, RunSpec, StepShape } from '../../common/schemas';
import { PATCH_RUN_BASELINE_4 } from '../../workflows/run-controller';
import { StasisKind, StasisResourceState, StasisStatus } from '../../workflows/search-attributes';
import { patchIds } from '../helpers/patches';
import { storedKeys, testS3 } from '../helpers/s3';
import { useStack, eventually } from '../helpers/stack';

// What a Run writes to its history: at most 24 events per suspend/resume cycle in every pause mode,
// one search-attribute upsert per workflow task at most, and none of what the Run was started with
// (the attributes the client set at start); and at its end, one destroy and no delete of its own.

const stack = useStack();
const s3 = testS3();

type Event = temporal.api.history.v1.IHistoryEvent;
const {
  EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: UPSERT,
  EVENT_TYPE_WORKFLOW_TASK_COMPLETED: TASK_COMPLETED,
  EVENT_TYPE_MARKER_RECORDED: MARKER,
  EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: UPDATE_ACCEPTED,
  EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: TASK_SCHEDULED,
} = temporal.api.enums.v1.EventType;

async function events(workflowId: string): Promise<Event[]> {
  const history = await stack.temporal.workflow.getHandle(workflowId).fetchHistory();
  return history.events ?? [];
}

type EventName = keyof typeof temporal.api.enums.v1.EventType;
const typeName = (e: Event): string =>
  (temporal.api.enums.v1.EventType[e.eventType ?? 0] as EventName).replace('EVENT_TYPE_', '');
const activityName = (e: Event) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? undefined;

/** Events by type (activities scheduled by name), e.g. { TIMER_STARTED: 1, 'scheduled execInSandbox': 2 }. */
function countTypes(all: Event[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const e of all) {
    const name = activityName(e);
    const key = name ? `scheduled ${name}` : typeName(e);
    counts[key] = (counts[key] ?? 0) + 1;
  }
  return counts;
}

/** `exec → (ask → exec that appends to a file and prints it) × cycles → complete`, suspended in `mode`. */
async function cycleSpec(mode: PauseMode, cycles: number): Promise<RunSpec> {
  const steps: StepShape[] = [{ exec: 'echo start > cycles.txt' }];
  for (let i = 1; i <= cycles; i++)
    steps.push({ ask: `cycle ${i}?` }, { exec: `echo cycle ${i} >> cycles.txt && cat cycles.txt` });
  steps.push({ complete: 'done' });
  const agent = { driver: 'scripted', steps };
  if (mode === 'DETACH') return { agent, sandbox: { provider: 'local' }, policy: { pauseMode: 'DETACH' } };
  if (mode === 'SNAPSHOT_AND_TERMINATE') return { agent, sandbox: { provider: 'local' } };
  // TERMINATE keeps the workspace on the host: an active one (under STASIS_HOST_PATHS, the tmp dir here).
  const hostPath = path.join(await mkdtemp(path.join(os.tmpdir(), 'stasis-cycles-')), 'ws');
  return { agent, sandbox: { provider: 'local', workspace: { kind: 'active', hostPath } } };
}

/** Runs `cycles` cycles, answering each once the sandbox is released; the Run's history. */
async function runCycles(mode: PauseMode, cycles: number): Promise<Event[]> {
  const { runId } = await stack.client.runs.start(await cycleSpec(mode, cycles));
  for (let i = 1; i <= cycles; i++) {
    // Watched through describe until released, then asked once: a query polled while the Run's local
    // agent step runs ends that workflow task early, adding a workflow task to the cycle being counted.
    await eventually(
      async () => {
        const attributes = (await stack.temporal.workflow.getHandle(runId).describe()).typedSearchAttributes;
        if (attributes.get(StasisResourceState) !== 'RELEASED' || attributes.get(StasisStatus) !== 'WAITING')
          return false;
        const view = await stack.client.runs.resource(runId);
        return view.record.state === 'RELEASED' && view.suspension?.interactionIds.includes(`int-${i}`);
      },
      60_000,
      `cycle ${i} released`,
    );
    await stack.client.runs.respond(runId, `int-${i}`, { decision: 'approve' });
  }
  expect(await stack.temporal.workflow.getHandle(runId).result()).toBe('done');
  // Its end left nothing in the store, whoever deleted it.
  expect(await storedKeys(s3, (await stack.client.runs.resource(runId)).record.sandboxId)).toEqual([]);
  return events(runId);
}

/** The stdout of each job that ran with a fused resume, from its activity's result in the history. */
function fusedJobOutputs(all: Event[]): string[] {
  const fused = new Set(all.filter((e) => activityName(e) === 'resumeAndExecInSandbox').map((e) => String(e.eventId)));
  return all.flatMap((e) => {
    const done = e.activityTaskCompletedEventAttributes;
    if (!done || !fused.has(String(done.scheduledEventId))) return [];
    const data = done.result?.payloads?.[0]?.data;
    const result = JSON.parse(Buffer.from(data ?? []).toString('utf8')) as { outcome?: { stdout: string } };
    return [result.outcome?.stdout ?? '(no outcome)'];
  });
}

test.each(['DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'] as const)(
  'a %s cycle (ask → suspend → respond → resume → exec) costs at most 24 history events: the resume runs with its job, no timer per cycle',
  async (mode) => {
    const three = await runCycles(mode, 3);
    // One whole cycle: from the workflow task of the second answer to that of the third
    // (respond → resume + exec → ask → suspend → released).
    const answers = three.flatMap((e, i) =>
      e.eventType === UPDATE_ACCEPTED
        ? [
            three
              .slice(0, i)
              .map((x) => x.eventType)
              .lastIndexOf(TASK_SCHEDULED),
          ]
        : [],
    );
    expect(answers).toHaveLength(3);
    const cycle = three.slice(answers[1], answers[2]);
    const perCycle = cycle.length;
    const typesPerCycle = countTypes(cycle);
    // At most 24; on failure the diff shows which events a cycle wrote.
    expect({ perCycle, typesPerCycle }).toEqual({ perCycle: Math.min(perCycle, 24), typesPerCycle });
    // The resume and the job after it are one activity; no attach, restore or exec of their own.
    expect(typesPerCycle['scheduled resumeAndExecInSandbox']).toBe(1);
    for (const name of ['execInSandbox', 'sandboxOp', 'restoreSandbox'])
      expect(typesPerCycle[`scheduled ${name}`]).toBeUndefined();
    // One retention timer for the Run, not one started and cancelled per suspension.
    expect(typesPerCycle.TIMER_STARTED).toBeUndefined();
    expect(typesPerCycle.TIMER_CANCELED).toBeUndefined();
    expect(countTypes(three).TIMER_STARTED).toBe(1);
    // This worker has no webhook and said so when it provisioned the sandbox: no delivery activity at all
    // (one at the first ask used to find that out, and its workflow task held up the first release's).
    expect(countTypes(three)['scheduled deliverWebhook']).toBeUndefined();
    // The Run's end: the host's destroy deleted its checkpoints and said so, so the Run sends no delete of its own.
    expect(countTypes(three)['scheduled sandboxOp']).toBe(1);
    expect(countTypes(three)['scheduled deleteSandboxCheckpoints']).toBeUndefined();
    expect(typesPerCycle.WORKFLOW_TASK_COMPLETED).toBeLessThanOrEqual(3);
    // And still one search-attribute upsert per workflow task.
    expect(upsertsPerTask(cycle).filter((upserts) => upserts.length > 1)).toEqual([]);
    // Each job ran once, after its resume, in the workspace the earlier ones left.
    expect(fusedJobOutputs(three)).toEqual([
      'start\ncycle 1\n',
      'start\ncycle 1\ncycle 2\n',
      'start\ncycle 1\ncycle 2\ncycle 3\n',
    ]);
  },
);

const upsertedNames = (e: Event) =>
  Object.keys(e.upsertWorkflowSearchAttributesEventAttributes?.searchAttributes?.indexedFields ?? {});

/** Our upserts (not the SDK's TemporalChangeVersion of a patch), grouped by the workflow task whose commands they are. */
function upsertsPerTask(all: Event[]): string[][][] {
  const tasks: string[][][] = [];
  for (const e of all) {
    if (e.eventType === TASK_COMPLETED) tasks.push([]);
    else if (e.eventType === UPSERT) {
      const names = upsertedNames(e).filter((n) => n !== 'TemporalChangeVersion');
      if (names.length) tasks[tasks.length - 1].push(names);
    }
  }
  return tasks;
}

test.each(['DETACH', 'SNAPSHOT_AND_TERMINATE'] as const)(
  'a %s ask → answer → exec cycle: search attributes upserted at most once per workflow task and never what the Run started with',
  async (pauseMode) => {
    const { runId } = await stack.client.runs.start({
      agent: {
        driver: 'scripted',
        steps: [{ exec: 'echo one' }, { ask: 'go on?' }, { exec: 'echo two' }, { complete: 'done' }],
      },
      sandbox: { provider: 'local' },
      policy: { pauseMode },
    });
    await eventually(async () => (await stack.client.runs.resource(runId)).phase === 'SUSPENDED', 60_000, 'suspended');
    await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    expect(await stack.temporal.workflow.getHandle(runId).result()).toBe('done');

    const all = await events(runId);
    // Scripted steps are local activities: one marker each, no activity (workflows/run-controller.ts).
    const scheduled = all.flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
    expect(scheduled.filter((name) => name === 'agentStep')).toEqual([]);
    expect(
      all.filter(
        (e) => e.eventType === MARKER && e.markerRecordedEventAttributes?.markerName === 'core_local_activity',
      ),
    ).toHaveLength(4);
    // One patch marker for a new Run (PATCH_RUN_BASELINE_4 holds every change of Run code so far), so one
    // upsert of TemporalChangeVersion, which the SDK adds to each marker: eight of each before.
    expect(patchIds(all)).toEqual([PATCH_RUN_BASELINE_4]);
    expect(all.filter((e) => upsertedNames(e).includes('TemporalChangeVersion'))).toHaveLength(1);
    const tasks = upsertsPerTask(all);
    expect(tasks.filter((upserts) => upserts.length > 1)).toEqual([]);
    const names = tasks.flat(2);
    // Set by the client at start, so never written again.
    for (const name of ['StasisKind', 'StasisProvider']) expect(names).not.toContain(name);
    // The changes still reach visibility: the Run went WAITING and back, its record RELEASED or RETAINED and on.
    expect(names).toEqual(expect.arrayContaining(['StasisStatus', 'StasisResourceState', 'StasisPendingInteractions']));
    const listed = await eventually(
      async () => {
        for await (const wf of stack.temporal.workflow.list({
          query: `WorkflowId = '${runId}' AND StasisStatus = 'COMPLETED'`,
        }))
          return wf;
        return undefined;
      },
      30_000,
      'visible as COMPLETED',
    );
    expect(listed.typedSearchAttributes.get(StasisKind)).toBe('run');
  },
);

test('a standalone sandbox’s first workflow task upserts nothing it was started with', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.exec(sandboxId, { command: 'true' });
  await stack.client.sandboxes.destroy(sandboxId);
  const tasks = upsertsPerTask(await events(`sandbox-${sandboxId}`));
  expect(tasks.filter((upserts) => upserts.length > 1)).toEqual([]);
  const names = tasks.flat(2);
  for (const name of ['StasisKind', 'StasisProvider']) expect(names).not.toContain(name);
  expect(names).toEqual(expect.arrayContaining(['StasisStatus', 'StasisResourceState', 'StasisHostId']));
});
