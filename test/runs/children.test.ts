import { RUN_ID_MAX } from '../../common/wire-checks';
import { childRunId } from '../../workflows/definitions';
import { useStack, eventually } from '../helpers/stack';
import { parentWithChild } from '../helpers/runs';

const stack = useStack();

const child = (runId: string) => ({
  runId,
  agent: { driver: 'scripted', steps: [{ ask: `child ${runId} may go?` }, { complete: runId }] },
  sandbox: { provider: 'local' },
});

test('a parent stays RELEASE_BLOCKED until both children are RELEASED, and completes after them', async () => {
  const parentId = `parent-${Date.now()}`;
  const { runId } = await stack.client.runs.start({
    runId: parentId,
    agent: {
      driver: 'scripted',
      steps: [
        { spawn: child(`${parentId}.c1`) },
        { spawn: child(`${parentId}.c2`) },
        { ask: 'parent may go?' },
        { complete: 'parent done' },
      ],
    },
    sandbox: { provider: 'local' },
  });
  const children = [`${parentId}.c1`, `${parentId}.c2`];
  const parent = stack.temporal.workflow.getHandle(runId);
  await eventually(
    async () => (await stack.client.runs.resource(runId)).record.state === 'RELEASED',
    60_000,
    'parent RELEASED',
  );

  // Order of events in the parent's history: both children reported RELEASED before the parent's release started.
  const events = (await parent.fetchHistory()).events ?? [];
  const signalIndex = (childId: string) =>
    events.findIndex((e) => {
      const attrs = e.workflowExecutionSignaledEventAttributes;
      if (attrs?.signalName !== 'childState') return false;
      const input = JSON.parse(Buffer.from(attrs.input?.payloads?.[0]?.data ?? []).toString()) as {
        runId: string;
        state: string;
      };
      return input.runId === childId && input.state === 'RELEASED';
    });
  const releaseIndex = events.findIndex(
    (e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'releaseSandbox',
  );
  for (const id of children) {
    expect(signalIndex(id)).toBeGreaterThan(-1);
    expect(signalIndex(id)).toBeLessThan(releaseIndex);
  }
  const view = await stack.client.runs.resource(runId);
  expect(view.children).toEqual(children.map((id) => ({ runId: id, state: 'RELEASED' })));
  expect((await stack.client.runs.get(runId)).childRunIds).toEqual(children);
  expect((await stack.client.runs.get(children[0])).parentRunId).toBe(runId);

  // The parent answered first still waits for its children's compute before completing.
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await eventually(async () => (await stack.client.runs.resource(runId)).phase === 'ACTIVE', 30_000, 'parent resumed');
  expect((await stack.client.runs.get(runId)).status).toBe('RUNNING');
  for (const id of children) await stack.client.runs.respond(id, 'int-1', { decision: 'approve' });
  await expect(parent.result()).resolves.toBe('parent done');
  for (const id of children) expect((await stack.client.runs.resource(id)).record.state).toBe('DESTROYED');
});

test('while a child holds compute the parent is RELEASE_BLOCKED with a blocked age', async () => {
  const parentId = `parent-blocked-${Date.now()}`;
  await stack.client.runs.start({
    runId: parentId,
    agent: {
      driver: 'scripted',
      steps: [
        {
          spawn: {
            ...child(`${parentId}.c1`),
            agent: {
              driver: 'scripted',
              steps: [{ exec: 'sleep 600', background: true, pauseBehavior: 'CONTINUE' }, { ask: 'x' }],
            },
          },
        },
        { ask: 'parent?' },
      ],
    },
    sandbox: { provider: 'local' },
  });
  const blocked = await eventually(
    async () => {
      const view = await stack.client.runs.resource(parentId);
      return view.record.state === 'RELEASE_BLOCKED' && view.children[0]?.state === 'RELEASE_BLOCKED'
        ? view
        : undefined;
    },
    30_000,
    'parent and child RELEASE_BLOCKED',
  );
  expect(blocked.blockedAgeSeconds).toEqual(expect.any(Number));
  expect(blocked.children).toEqual([{ runId: `${parentId}.c1`, state: 'RELEASE_BLOCKED' }]);
  await stack.client.runs.cancel(parentId);
  // Cancelling the parent cancels the child too (the parent cancels its children when it ends).
  await eventually(
    async () => (await stack.client.runs.get(`${parentId}.c1`)).status === 'CANCELLED',
    30_000,
    'child cancelled',
  );
  expect((await stack.client.runs.get(parentId)).status).toBe('CANCELLED');
});

test('a completed parent waiting for a long child it watches adds nothing to its history meanwhile', async () => {
  const { parentId, childId, spec } = parentWithChild(
    'parent-quiet',
    [{ exec: 'sleep 600' }, { complete: 'child' }],
    [{ complete: 'parent done' }],
  );
  await stack.client.runs.start(spec);
  const parent = stack.temporal.workflow.getHandle(parentId);
  // The parent has taken its `complete` (its last step, a local activity marker) and waits in finish.
  await eventually(
    async () =>
      ((await parent.fetchHistory()).events ?? []).filter(
        (e) => e.markerRecordedEventAttributes?.markerName === 'core_local_activity',
      ).length === 2,
    60_000,
    'parent waiting for its child',
  );
  await eventually(
    async () => (await stack.client.runs.resource(childId)).record.state === 'ACTIVE',
    60_000,
    'child running',
  );
  await new Promise((r) => setTimeout(r, 3_000));
  const before = (await parent.describe()).historyLength;
  // Past two of the old 30 s pings.
  await new Promise((r) => setTimeout(r, 65_000));
  const described = await parent.describe();
  expect(described.status.name).toBe('RUNNING');
  expect(described.historyLength).toBe(before);
  // The child's end still reaches it.
  await stack.client.runs.cancel(childId);
  await expect(parent.result()).resolves.toBe('parent done');
  // Its baseline marker stands for the changes to how a parent waits: no marker of their own.
  const patches = ((await parent.fetchHistory()).events ?? []).filter(
    (e) => e.markerRecordedEventAttributes?.markerName === 'core_patch',
  );
  expect(patches).toHaveLength(1);
}, 150_000);

test('a parent its agent fails (a denial) cancels its live children, as a cancelled parent does', async () => {
  const { parentId, childId, spec } = parentWithChild(
    'parent-denied',
    [{ ask: 'never answered' }],
    [{ ask: 'go on?' }, { complete: 'parent done' }],
  );
  await stack.client.runs.start(spec);
  await eventually(async () => (await stack.client.runs.get(childId)).status === 'WAITING', 30_000, 'child waiting');
  await eventually(
    async () => (await stack.client.runs.get(parentId)).interactions.some((i) => i.status === 'pending'),
    30_000,
    'parent asks',
  );
  await stack.client.runs.respond(parentId, 'int-1', { decision: 'deny' });
  await expect(stack.temporal.workflow.getHandle(parentId).result()).rejects.toThrow();
  expect(await stack.client.runs.get(parentId)).toMatchObject({ status: 'FAILED', error: { code: 'DENIED' } });
  await eventually(
    async () => (await stack.client.runs.get(childId)).status === 'CANCELLED',
    30_000,
    'child cancelled',
  );
  expect((await stack.temporal.workflow.getHandle(childId).describe()).status.name).toBe('CANCELLED');
});

test('a child whose spawn gives no id, of a parent with the longest id, has a Run id the client addresses', async () => {
  // The longest new Run id there is: `<id>.child-1` was started, but no client could get or answer it (and
  // its sandbox's id was too long to provision).
  const parentId = `long-${Date.now()}-`.padEnd(RUN_ID_MAX, 'p');
  const unnamed = (ask: string, steps: object[] = []) => ({
    agent: { driver: 'scripted', steps: [...steps, { ask }, { complete: ask }] },
    sandbox: { provider: 'local' },
  });
  const { runId } = await stack.client.runs.start({
    runId: parentId,
    agent: {
      driver: 'scripted',
      steps: [
        { spawn: unnamed('first child may go?', [{ spawn: unnamed('grandchild may go?') }]) },
        { spawn: unnamed('second child may go?') },
        { complete: 'parent done' },
      ],
    },
    sandbox: { provider: 'local' },
  });
  const first = childRunId(parentId, 1);
  const second = childRunId(parentId, 2);
  const grandchild = childRunId(first, 1);
  for (const id of [first, second, grandchild]) expect(id).toHaveLength(RUN_ID_MAX);
  expect(new Set([first, second, grandchild]).size).toBe(3);
  const children = await eventually(
    async () => {
      const ids = (await stack.client.runs.get(runId)).childRunIds;
      return ids.length === 2 ? ids : undefined;
    },
    60_000,
    'both children spawned',
  );
  expect(children).toEqual([first, second]);
  const pending = async (id: string) =>
    (await stack.client.runs.get(id)).interactions.some((i) => i.id === 'int-1' && i.status === 'pending')
      ? true
      : undefined;
  for (const id of [grandchild, first, second]) {
    await eventually(() => pending(id), 60_000, `${id} asks`);
    await stack.client.runs.respond(id, 'int-1', { decision: 'approve' });
  }
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('parent done');
  expect((await stack.client.runs.get(grandchild)).parentRunId).toBe(first);
});
