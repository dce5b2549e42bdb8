import { temporal } from '@temporalio/proto';
import { Worker } from '@temporalio/worker';
import { workflowBundle } from '../../workers/worker';
import { useStack, startStack, eventually } from '../helpers/stack';

// Scripted steps run as local activities while clients poll the Run. A query that reaches a Run
// while a local step runs makes Temporal end that workflow task early and deliver the step's result
// in the next one; replay delivers it in the first. A patch the Run asked for first after the step
// was then unknown to replay: the Run failed every workflow task from there (it stalled) once its
// worker replayed it. A cache of 2 makes the worker replay the Runs as they go.

const stack = useStack(() => startStack({ env: { STASIS_MAX_CACHED_WORKFLOWS: '2' } }));

type Event = temporal.api.history.v1.IHistoryEvent;
const {
  EVENT_TYPE_MARKER_RECORDED: MARKER,
  EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: TASK_SCHEDULED,
  EVENT_TYPE_WORKFLOW_TASK_FAILED: TASK_FAILED,
} = temporal.api.enums.v1.EventType;

/** The failure of a stalled Run (a benign failed task, as an unhandled command under load, is not one). */
const isNondeterminism = (e: Event) =>
  e.eventType === TASK_FAILED &&
  e.workflowTaskFailedEventAttributes?.cause ===
    temporal.api.enums.v1.WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR;

const isStep = (e: Event) =>
  e.eventType === MARKER && e.markerRecordedEventAttributes?.markerName === 'core_local_activity';

/** A local step whose result reached the workflow in a later workflow task than its marker's. */
const splitSteps = (events: Event[]) =>
  events.filter((e, i) => isStep(e) && events[i + 1]?.eventType === TASK_SCHEDULED);

const spec = (n: number) => ({
  agent: {
    driver: 'scripted',
    steps: [
      { writeFile: { path: 'n.txt', content: `${n}` } },
      { exec: 'cat n.txt' },
      { ask: `go on with ${n}?`, kind: 'input' },
      { expectFile: { path: 'n.txt', content: `${n}` } },
      { complete: n },
    ],
  },
  sandbox: { provider: 'local' },
});

// Four Runs and twelve pollers on a machine shared with other test files: minutes, not the default two.
test('Runs polled while their local steps run, evicted and replayed, all complete without a nondeterminism failure and replay from their histories', async () => {
  const runIds: string[] = [];
  for (let n = 0; n < 4; n++) runIds.push((await stack.client.runs.start(spec(n))).runId);
  let polling = true;
  // Queries as fast as the server answers them, three clients per Run (the approval page polls too).
  const pollers = runIds.flatMap((runId) =>
    [0, 1, 2].map(async () => {
      while (polling) {
        await stack.client.runs.get(runId).catch(() => undefined);
        await stack.client.runs.resource(runId).catch(() => undefined);
      }
    }),
  );
  try {
    for (const runId of runIds) {
      await eventually(
        async () => (await stack.client.runs.resource(runId)).phase === 'SUSPENDED',
        60_000,
        `${runId} suspended`,
      );
    }
    for (const [n, runId] of runIds.entries()) await stack.client.runs.respond(runId, 'int-1', { input: `${n}` });
    // A stalled Run fails its workflow task again and again: wait for an end or the first such failure.
    for (const runId of runIds) {
      const handle = stack.temporal.workflow.getHandle(runId);
      await eventually(
        async () =>
          (await handle.describe()).status.name !== 'RUNNING' ||
          ((await handle.fetchHistory()).events ?? []).some(isNondeterminism),
        60_000,
        `${runId} closed or failing`,
      );
    }
    const failed = await Promise.all(
      runIds.map(async (runId) =>
        ((await stack.temporal.workflow.getHandle(runId).fetchHistory()).events ?? [])
          .filter(isNondeterminism)
          .map((e) => `${runId}: ${e.workflowTaskFailedEventAttributes?.failure?.message}`),
      ),
    );
    expect(failed.flat()).toEqual([]);
    for (const [n, runId] of runIds.entries()) expect(await stack.temporal.workflow.getHandle(runId).result()).toBe(n);
  } finally {
    polling = false;
    await Promise.all(pollers);
  }

  const histories = await Promise.all(
    runIds.map(async (workflowId) => ({
      workflowId,
      history: await stack.temporal.workflow.getHandle(workflowId).fetchHistory(),
    })),
  );
  const events = histories.map((h) => h.history.events ?? []);
  // The steps were local: five markers per Run, no agentStep activity.
  for (const all of events) {
    expect(all.filter(isStep)).toHaveLength(5);
    expect(all.filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'agentStep')).toEqual([]);
  }
  // The attack happened: some query ended a workflow task while its local step ran.
  expect(events.flatMap(splitSteps).length).toBeGreaterThan(0);

  const failures: string[] = [];
  for await (const result of Worker.runReplayHistories({ workflowBundle: await workflowBundle() }, histories)) {
    if (result.error) failures.push(`${result.workflowId}: ${result.error.message}`);
  }
  expect(failures).toEqual([]);
}, 300_000);
