import * as fc from 'fast-check';
import type { InteractionResponse } from '../../common/schemas';
import { respondSignal, respondUpdate } from '../../workflows/definitions';
import { useStack, eventually } from '../helpers/stack';

// The structured interaction contract end to end on a real worker: what an
// interaction carries, which answers it takes (anything else is refused and
// changes nothing), what the agent gets back, and answering by signal.

const stack = useStack();

const spec = (steps: unknown[], labels?: Record<string, string>) => ({
  agent: { driver: 'scripted', steps },
  sandbox: { provider: 'local' },
  ...(labels ? { labels } : {}),
});

const waiting = (runId: string) =>
  eventually(
    async () => {
      const snapshot = await stack.client.runs.get(runId);
      return snapshot.status === 'WAITING' && snapshot;
    },
    60_000,
    'WAITING',
  );

/**
 * The history's length once no workflow task and no activity is in flight (a running
 * activity, e.g. the release after the ask, writes its events only when it ends).
 */
async function quietHistoryLength(runId: string): Promise<number> {
  const handle = stack.temporal.workflow.getHandle(runId);
  return eventually(
    async () => {
      const first = (await handle.fetchHistory()).events ?? [];
      const { raw } = await handle.describe();
      const busy = (raw.pendingActivities?.length ?? 0) > 0 || Boolean(raw.pendingWorkflowTask);
      await new Promise((r) => setTimeout(r, 300));
      const again = (await handle.fetchHistory()).events ?? [];
      const last = again[again.length - 1];
      const taskPending = Boolean(
        last?.workflowTaskScheduledEventAttributes || last?.workflowTaskStartedEventAttributes,
      );
      return first.length === again.length && !busy && !taskPending ? again.length : undefined;
    },
    30_000,
    'a quiet history',
  );
}

test('an interaction carries title, details, the action, options, resolved accepts and the Run labels', async () => {
  const ask = {
    ask: 'Roll out web-42?',
    title: 'Roll out web-42',
    details: '## Plan\n- canary first',
    action: { command: 'deploy web-42', files: ['deploy/web.yaml'], diff: '-replicas: 2\n+replicas: 4\n' },
    options: ['canary', 'full'],
  };
  const { runId } = await stack.client.runs.start(spec([ask], { team: 'web', env: 'prod' }));
  const snapshot = await waiting(runId);
  expect(snapshot.interactions[0]).toMatchObject({
    id: 'int-1',
    kind: 'approval',
    prompt: 'Roll out web-42?',
    title: 'Roll out web-42',
    details: '## Plan\n- canary first',
    action: ask.action,
    options: ['canary', 'full'],
    accepts: ['approve', 'deny', 'option'],
    labels: { team: 'web', env: 'prod' },
    status: 'pending',
  });
  await stack.client.runs.respond(runId, 'int-1', { option: 'canary', comment: 'canary only' }, { respondedBy: 'bob' });
  // Without further steps the Run's output is the last result: what the agent got for its ask.
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({
    interactionId: 'int-1',
    option: 'canary',
    comment: 'canary only',
    respondedBy: 'bob',
  });
});

test('property: an answer outside accepts, or an option not offered, is refused with 400 naming it, and changes nothing', async () => {
  const options = ['canary', 'full'];
  const { runId } = await stack.client.runs.start(
    spec([{ ask: 'Which rollout?', options, accepts: ['option', 'deny'] }, { complete: 'done' }]),
  );
  await waiting(runId);
  const before = await quietHistoryLength(runId);
  const snapshotBefore = await stack.client.runs.get(runId);
  const wrong = fc.oneof(
    fc.record({ decision: fc.constant('approve' as const), comment: fc.string({ maxLength: 20 }) }),
    fc.record({
      decision: fc.constant('edit' as const),
      action: fc.record({ command: fc.string({ minLength: 1, maxLength: 20 }) }),
    }),
    fc.record({ input: fc.string({ maxLength: 20 }) }),
    fc.record({ option: fc.string({ minLength: 1, maxLength: 20 }).filter((o) => !options.includes(o)) }),
  );
  await fc.assert(
    fc.asyncProperty(wrong, async (response: InteractionResponse) => {
      const refusal = await stack.client.runs.respond(runId, 'int-1', response).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(refusal).toMatchObject({ code: 'INVALID_ARGUMENT', httpStatus: 400 });
      const message = (refusal as Error).message;
      if ('option' in response) expect(message).toContain('response.option:');
      else
        expect(message).toMatch(
          /response: the answer "(approve|edit|input)" is not accepted here; this interaction accepts option, deny/,
        );
    }),
    { numRuns: 20 },
  );
  // Refused Updates leave no event, and the Run is as it was.
  expect(await quietHistoryLength(runId)).toBe(before);
  expect(await stack.client.runs.get(runId)).toEqual(snapshotBefore);

  await stack.client.runs.respond(runId, 'int-1', { option: 'full' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
});

test('an edit reaches the agent: the next exec step runs the edited command', async () => {
  const { runId } = await stack.client.runs.start(
    spec([
      {
        ask: 'Clean the build?',
        action: { command: 'echo would-delete-everything' },
        accepts: ['approve', 'deny', 'edit'],
      },
      { exec: 'echo would-delete-everything' },
    ]),
  );
  const before = await waiting(runId);
  // An edit to a blank command would run nothing (or fail the Run's next step): refused, by the
  // client and by the Run itself when sent straight through Temporal, and nothing changes.
  const length = await quietHistoryLength(runId);
  for (const command of ['', '  ', '\t\n', '\u3000']) {
    const blank = { decision: 'edit', action: { command } } as const;
    await expect(stack.client.runs.respond(runId, 'int-1', blank)).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringContaining('command'),
    });
    await expect(
      stack.temporal.workflow
        .getHandle(runId)
        .executeUpdate(respondUpdate, { args: [{ interactionId: 'int-1', response: blank }] }),
    ).rejects.toMatchObject({ cause: { message: expect.stringMatching(/response\.action\.command.*white space/) } });
  }
  expect(await quietHistoryLength(runId)).toBe(length);
  expect(await stack.client.runs.get(runId)).toEqual(before);
  await stack.client.runs.respond(
    runId,
    'int-1',
    { decision: 'edit', action: { command: 'echo edited-by-a-person' }, comment: 'safer' },
    { respondedBy: 'carol' },
  );
  const output = (await stack.temporal.workflow.getHandle(runId).result()) as { stdout: string; exitCode: number };
  expect(output).toMatchObject({ exitCode: 0, stdout: 'edited-by-a-person\n' });
  const done = await stack.client.runs.get(runId);
  expect(done.interactions[0]).toMatchObject({
    status: 'answered',
    respondedBy: 'carol',
    response: { decision: 'edit', action: { command: 'echo edited-by-a-person' }, comment: 'safer' },
  });
});

test('a respondedBy with a control, bidi or invisible character is refused, by the client and by the Run itself, and changes nothing', async () => {
  const { runId } = await stack.client.runs.start(spec([{ ask: 'Ship it?' }, { complete: 'done' }]));
  const before = await waiting(runId);
  const length = await quietHistoryLength(runId);
  const handle = stack.temporal.workflow.getHandle(runId);
  // `alice\u200b` is shown as `alice` wherever a page or terminal prints it as it is.
  for (const respondedBy of ['alice\u200b', 'bob\u0007', 'carol\u2066', 'dave\u{e0041}']) {
    const refused = { code: 'INVALID_ARGUMENT', httpStatus: 400, message: expect.stringMatching(/respondedBy:/) };
    await expect(
      stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { respondedBy }),
    ).rejects.toMatchObject(refused);
    await expect(
      stack.client.runs.respondBySignal(runId, 'int-1', { decision: 'approve' }, { respondedBy }),
    ).rejects.toMatchObject(refused);
    // Straight through Temporal, past the client: the Run's validator refuses it.
    await expect(
      handle.executeUpdate(respondUpdate, {
        args: [{ interactionId: 'int-1', response: { decision: 'approve' }, respondedBy }],
      }),
    ).rejects.toMatchObject({
      cause: { message: expect.stringMatching(/respondedBy: must not contain a control, bidi or invisible character/) },
    });
  }
  expect(await quietHistoryLength(runId)).toBe(length);
  expect(await stack.client.runs.get(runId)).toEqual(before);
  expect(before.interactions[0]).toMatchObject({ status: 'pending' });
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { respondedBy: 'alice' });
  await expect(handle.result()).resolves.toBe('done');
  expect((await stack.client.runs.get(runId)).interactions[0]).toMatchObject({
    status: 'answered',
    respondedBy: 'alice',
  });
});

test('a denied gate fails the Run by default', async () => {
  const { runId } = await stack.client.runs.start(spec([{ ask: 'Drop the table?' }, { exec: 'echo dropped' }]));
  await waiting(runId);
  await stack.client.runs.respond(runId, 'int-1', { decision: 'deny' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect(await stack.client.runs.get(runId)).toMatchObject({ status: 'FAILED', error: { code: 'DENIED' } });
});

test('the respondSignal signal answers through the typed client; an answer the Run would refuse is refused before signalling', async () => {
  const { runId } = await stack.client.runs.start(spec([{ ask: 'Release name?', kind: 'input' }]));
  const snapshot = await waiting(runId);
  const before = await quietHistoryLength(runId);
  // What the Run would refuse never becomes a signal (a refused signal still lands in the history).
  await expect(
    stack.client.runs.respondBySignal(runId, 'int-1', { decision: 'approve' }, { respondedBy: 'mallory' }),
  ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  await expect(
    stack.client.runs.respondBySignal(runId, 'int-9', { input: 'v0' }, { respondedBy: 'mallory' }),
  ).rejects.toMatchObject({ code: 'NOT_FOUND', message: 'interaction int-9 not found' });
  await expect(stack.client.runs.respondBySignal(runId, 'int-1', { decision: 'maybe' })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
  });
  expect(await quietHistoryLength(runId)).toBe(before);
  // Sent anyway (a signal racing another answer), the Run logs and ignores it.
  const handle = stack.temporal.workflow.getHandle(runId);
  await handle.signal(respondSignal, {
    interactionId: 'int-1',
    response: { decision: 'approve' },
    respondedBy: 'mallory',
  });
  await handle.signal(respondSignal, { interactionId: 'int-9', response: { input: 'v0' }, respondedBy: 'mallory' });
  await quietHistoryLength(runId);
  expect(await stack.client.runs.get(runId)).toEqual(snapshot);

  await stack.client.runs.respondBySignal(runId, 'int-1', { input: 'v2.0' }, { respondedBy: 'dave' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({
    interactionId: 'int-1',
    input: 'v2.0',
    respondedBy: 'dave',
  });
  expect((await stack.client.runs.get(runId)).interactions[0]).toMatchObject({
    status: 'answered',
    respondedBy: 'dave',
  });
  await expect(stack.client.runs.respondBySignal(runId, 'int-1', { input: 'v3' })).rejects.toMatchObject({
    code: 'ALREADY_ANSWERED',
  });
});

test('an updateId used again: the same answer is idempotent, another answer ALREADY_ANSWERED, another interaction INVALID_ARGUMENT naming updateId', async () => {
  const { runId } = await stack.client.runs.start(spec([{ ask: 'One?' }, { ask: 'Two?' }, { complete: 'done' }]));
  await waiting(runId);
  const approved = await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { updateId: 'u-1' });
  expect(approved).toMatchObject({ id: 'int-1', status: 'answered', response: { decision: 'approve' } });
  // Temporal hands back the first Update's result for its id before the Run's validator runs.
  await expect(
    stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { updateId: 'u-1' }),
  ).resolves.toEqual(approved);
  await expect(
    stack.client.runs.respond(runId, 'int-1', { decision: 'deny' }, { updateId: 'u-1' }),
  ).rejects.toMatchObject({ code: 'ALREADY_ANSWERED', message: 'interaction int-1 was already answered' });
  await eventually(
    async () =>
      (await stack.client.runs.get(runId)).interactions.some((i) => i.id === 'int-2' && i.status === 'pending'),
    60_000,
    'int-2 pending',
  );
  await expect(
    stack.client.runs.respond(runId, 'int-2', { decision: 'approve' }, { updateId: 'u-1' }),
  ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^options: updateId: .*int-1/) });
  expect((await stack.client.runs.get(runId)).interactions.find((i) => i.id === 'int-2')).toMatchObject({
    status: 'pending',
  });
  await stack.client.runs.respond(runId, 'int-2', { decision: 'approve' }, { updateId: 'u-2' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
});
