import { temporal } from '@temporalio/proto';
import { StasisKind } from '../../workflows/search-attributes';
import { startStack, eventually, type TestStack } from '../helpers/stack';

// What a Run writes to its history: one search-attribute upsert per workflow task at most, and
// none of what the Run was started with (the attributes the client set at start).

let stack: TestStack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack?.stop();
});

type Event = temporal.api.history.v1.IHistoryEvent;
const {
  EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: UPSERT,
  EVENT_TYPE_WORKFLOW_TASK_COMPLETED: TASK_COMPLETED,
  EVENT_TYPE_MARKER_RECORDED: MARKER,
} = temporal.api.enums.v1.EventType;

async function events(workflowId: string): Promise<Event[]> {
  const history = await stack.temporal.workflow.getHandle(workflowId).fetchHistory();
  return history.events ?? [];
}

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
