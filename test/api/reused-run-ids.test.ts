import fc from 'fast-check';
import type { ActionView, RunSnapshot } from '../../common/schemas';
import { apiOnStack } from './api-stack';
import { errorCode, errorMessage } from './http';
import { eventually, saw } from '../helpers/stack';

// A Run id names one Run for good. Started again after its Run ended, the new Run took over the
// first one's sandbox id (its kept workspace, env and fences); spawned as a child, a taken id left
// the spawner holding another Run as its child.

const ADMIN = { name: 'root-ops', secret: 'admin-secret-0123456789', role: 'admin' } as const;
const AGENT = { name: 'bot', secret: 'agent-secret-0123456789', role: 'agent' } as const;
const api = apiOnStack([ADMIN, AGENT]);
const admin = api.as(ADMIN);
const agent = api.as(AGENT);

const external = (runId?: string) => ({
  ...(runId ? { runId } : {}),
  agent: { driver: 'external' },
  sandbox: { provider: 'local' },
});

async function startExternal(runId?: string): Promise<string> {
  const started = await agent('POST', '/api/v1/runs', { body: external(runId) });
  expect(started.status).toBe(201);
  return (started.json as { runId: string }).runId;
}

/** Sends an action and reads it until it settles. */
async function act(runId: string, actionId: string, action: unknown): Promise<ActionView> {
  const sent = await agent('POST', `/api/v1/runs/${runId}/actions?waitMs=30000`, { body: { actionId, action } });
  expect(sent.status).toBeLessThan(300);
  return eventually(
    async () => {
      const view = saw((await agent('GET', `/api/v1/runs/${runId}/actions/${actionId}`)).json as ActionView);
      return view.status === 'succeeded' || view.status === 'failed' ? view : undefined;
    },
    60_000,
    `${runId} ${actionId} settled`,
  );
}

const snapshot = async (runId: string) => (await admin('GET', `/api/v1/runs/${runId}`)).json as RunSnapshot;
/** Waits for the Run's workflow to close: a Run is CANCELLED before its ending has cancelled its children. */
const closed = (runId: string) =>
  eventually(
    async () => (await api.stack.temporal.workflow.getHandle(runId).describe()).status.name !== 'RUNNING',
    60_000,
    `${runId} closed`,
  );

test('starting a Run under an id used before is 409 ALREADY_EXISTS naming it, whether that Run runs or ended, and changes nothing', async () => {
  const runId = `reused-${Date.now()}`;
  await startExternal(runId);
  expect((await act(runId, 'w', { type: 'writeFile', path: 'secret.txt', content: 'SECRET-OF-RUN-1' })).status).toBe(
    'succeeded',
  );
  const whileRunning = await agent('POST', '/api/v1/runs', { body: external(runId) });
  expect([whileRunning.status, errorCode(whileRunning)]).toEqual([409, 'ALREADY_EXISTS']);

  expect((await agent('POST', `/api/v1/runs/${runId}/cancel`)).status).toBe(200);
  await closed(runId);
  const before = await snapshot(runId);
  expect(before.status).toBe('CANCELLED');
  // Any spec at all, the admin's included (an active workspace, env): the id is taken.
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(
        external(runId),
        { runId, agent: { driver: 'scripted', steps: [{ exec: 'cat secret.txt' }] }, sandbox: { provider: 'local' } },
        { ...external(runId), sandbox: { provider: 'local', env: { API_KEY: 'k' } } },
      ),
      fc.constantFrom(agent, admin),
      async (spec, caller) => {
        const again = await caller('POST', '/api/v1/runs', { body: spec });
        expect([again.status, errorCode(again)]).toEqual([409, 'ALREADY_EXISTS']);
        expect(errorMessage(again)).toContain(`run ${runId} already exists`);
      },
    ),
    { numRuns: 6 },
  );
  expect(await snapshot(runId)).toEqual(before);
  const history = await api.stack.temporal.workflow.getHandle(runId).describe();
  expect(history.status.name).toBe('CANCELLED'); // the same execution: none was started after it
  await expect(api.stack.client.runs.start(external(runId))).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
});

test('a completed Run id is not started again either', async () => {
  const runId = await startExternal();
  await act(runId, 'c', { type: 'complete', output: 'done' });
  await eventually(async () => (await snapshot(runId)).status === 'COMPLETED', 60_000, 'COMPLETED');
  const again = await agent('POST', '/api/v1/runs', { body: external(runId) });
  expect([again.status, errorCode(again)]).toEqual([409, 'ALREADY_EXISTS']);
});

test('a spawn under another live Run id fails ALREADY_EXISTS and registers no child: cancelling the spawner leaves that Run alone', async () => {
  const other = await startExternal();
  const spawner = await startExternal();
  const spawned = await act(spawner, 's', { type: 'spawn', spec: external(other) });
  expect(spawned.status).toBe('failed');
  expect(spawned.error).toEqual({
    code: 'ALREADY_EXISTS',
    message: expect.stringContaining(`run ${other} already exists`),
  });
  expect(((await admin('GET', `/api/v1/runs/${spawner}/resource`)).json as { children: unknown[] }).children).toEqual(
    [],
  );
  expect((await snapshot(spawner)).childRunIds ?? []).toEqual([]);

  expect((await agent('POST', `/api/v1/runs/${spawner}/cancel`)).status).toBe(200);
  await closed(spawner);
  expect((await snapshot(other)).status).toBe('RUNNING');
  expect((await api.stack.temporal.workflow.getHandle(other).describe()).status.name).toBe('RUNNING');

  // Nor is an ended Run's id spawned again (the child would take over its sandbox id).
  const third = await startExternal();
  const reuse = await act(third, 's', { type: 'spawn', spec: external(spawner) });
  expect([reuse.status, reuse.error?.code]).toEqual(['failed', 'ALREADY_EXISTS']);
  expect((await act(third, 's2', { type: 'spawn', spec: external() })).status).toBe('succeeded'); // a fresh id still starts
});

test('a spawner whose spawn failed on a taken id completes while that Run lives on', async () => {
  const other = await startExternal();
  const spawner = await startExternal();
  expect((await act(spawner, 's', { type: 'spawn', spec: external(other) })).status).toBe('failed');
  // Its own id too: a Run is never its own child.
  expect((await act(spawner, 'self', { type: 'spawn', spec: external(spawner) })).error?.code).toBe('ALREADY_EXISTS');
  await act(spawner, 'c', { type: 'complete', output: 1 });
  await eventually(async () => (await snapshot(spawner)).status === 'COMPLETED', 60_000, 'spawner COMPLETED');
  expect((await snapshot(other)).status).toBe('RUNNING');
});

test('an agent cannot take the id of another Run’s webhook delivery or unnamed child: 400 naming runId, nothing started', async () => {
  // A delivery's id is `webhook-<first run id>-<n>` (its receiver sees them) and an unnamed child's
  // `<parent>.child-<n>`: started first by a Run, they made the delivery's start fail (its
  // notifications were lost) and the parent's spawn fail.
  const parent = await startExternal();
  for (const [body, field] of [
    [external('webhook-0b5e1c2a-7f3d-4e8a-9c1b-2d3e4f5a6b7c-2'), 'body.runId'],
    [external(`${parent}.child-1`), 'body.runId'],
  ] as const) {
    const refused = await agent('POST', '/api/v1/runs', { body });
    expect([refused.status, errorCode(refused)]).toEqual([400, 'INVALID_ARGUMENT']);
    expect(errorMessage(refused)).toContain(field);
    const id = (body as { runId: string }).runId;
    await expect(api.stack.temporal.workflow.getHandle(id).describe()).rejects.toThrow(/not found/i);
  }
  // Nor through a spawn action of an external agent.
  const spawned = await agent('POST', `/api/v1/runs/${parent}/actions?waitMs=0`, {
    body: { actionId: 's1', action: { type: 'spawn', spec: external(`${parent}.child-2`) } },
  });
  expect([spawned.status, errorCode(spawned)]).toEqual([400, 'INVALID_ARGUMENT']);
  expect(errorMessage(spawned)).toMatch(/runId: must not end with "\.child-<n>"/);
});
