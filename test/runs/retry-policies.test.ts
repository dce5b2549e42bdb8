import { temporal } from '@temporalio/proto';
import { NON_RETRYABLE_CODES } from '../../common/errors';
import { useStack, eventually } from '../helpers/stack';

// Every retry policy derives from the one non-retryable set: read off what a real Run
// scheduled, activity by activity (release and shared steps once listed fewer codes).

const stack = useStack();

const SCHEDULED = temporal.api.enums.v1.EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED;

test('a Run that suspends, restores and ends schedules every activity with exactly the non-retryable set', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      // The first resume runs with its job (resumeAndExecInSandbox), the second before a file write (restoreSandbox).
      steps: [
        { exec: 'echo one' },
        { ask: 'go on?' },
        { exec: 'echo two' },
        { ask: 'and on?' },
        { writeFile: { path: 'f', content: 'x' } },
        { complete: 'done' },
      ],
    },
    sandbox: { provider: 'local' },
    policy: { pauseMode: 'SNAPSHOT_AND_TERMINATE' },
  });
  for (const id of ['int-1', 'int-2']) {
    await eventually(
      async () => {
        const view = await stack.client.runs.resource(runId);
        return view.phase === 'SUSPENDED' && view.suspension?.interactionIds.includes(id);
      },
      60_000,
      `suspended on ${id}`,
    );
    await stack.client.runs.respond(runId, id, { decision: 'approve' });
  }
  expect(await stack.temporal.workflow.getHandle(runId).result()).toBe('done');

  const history = await stack.temporal.workflow.getHandle(runId).fetchHistory();
  const scheduled = (history.events ?? [])
    .filter((e) => e.eventType === SCHEDULED)
    .map((e) => e.activityTaskScheduledEventAttributes!);
  const names = scheduled.map((a) => a.activityType?.name);
  // The Run did go through release and restore, so their policies are among those read.
  expect(names).toEqual(
    expect.arrayContaining(['provisionSandbox', 'releaseSandbox', 'resumeAndExecInSandbox', 'restoreSandbox']),
  );
  const expected = [...NON_RETRYABLE_CODES].sort();
  for (const a of scheduled) {
    const list = [...(a.retryPolicy?.nonRetryableErrorTypes ?? [])].sort();
    expect({ activity: a.activityType?.name, list }).toEqual({ activity: a.activityType?.name, list: expected });
  }
});
