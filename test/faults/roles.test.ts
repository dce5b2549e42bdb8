import { existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { RouteDef } from '../../api/route';
import { apiRoutes } from '../../api/routes';
import { API_IDENTITY_PREFIX, buildApi } from '../../api/server';
import { allows, ROLES, type Role } from '../../common/roles';
import { sandboxWorkflowId } from '../../workflows/definitions';
import { listenOnLoopback, type CallOptions, type HttpResult } from '../api/http';
import { eventually, saw, startStack, type TestStack } from '../helpers/stack';
import { historyEvents, startWaitingRun, Tally, writeSummary, type HistoryEvent } from './helpers';

// Area roles: every route of the route table, called by every role. Each call
// either does its job (the route's status) or is 403 FORBIDDEN, as the route
// declares, and a 403 changes nothing: the Run still waits, the sandbox is in
// the same state with the same files, no workflow was started. Requests for an
// active workspace need admin. Then: who did what is on the Temporal history.

const TOKENS = ROLES.map((role) => ({ name: `${role}-1`, secret: `${role}-secret-0123456789`, role }));
const secretOf = (role: Role) => TOKENS.find((t) => t.role === role)!.secret;

let stack: TestStack;
let app: FastifyInstance;
let call: (method: string, path: string, options?: CallOptions) => Promise<HttpResult>;
const tally = new Tally();
let escapes = 0;

beforeAll(async () => {
  stack = await startStack();
  app = buildApi({ client: stack.client, tokens: TOKENS, logger: false });
  call = await listenOnLoopback(app);
});
afterAll(async () => {
  await app?.close();
  await stack?.stop();
});

const as =
  (role: Role) =>
  (method: string, url: string, options: CallOptions = {}) =>
    call(method, url, { token: secretOf(role), ...options });

const waitingRun = (): Promise<string> => startWaitingRun(stack.client);

/** A Run busy in its sandbox (a manual suspend applies to it), suspended by hand if asked. */
async function busyRun(suspended: boolean): Promise<string> {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ exec: 'sleep 2' }, { exec: 'echo after' }] },
    sandbox: { provider: 'local' },
  });
  if (suspended) await stack.client.runs.suspend(runId);
  return runId;
}

const EXTERNAL_ACTION = { actionId: 'a1', action: { type: 'exec', command: 'true' } };

/** A Run whose agent is external, after its first action. */
async function externalRun(): Promise<string> {
  const { runId } = await stack.client.runs.start({ agent: { driver: 'external' }, sandbox: { provider: 'local' } });
  await stack.client.runs.act(runId, EXTERNAL_ACTION, { waitMs: 60_000 });
  return runId;
}

async function sandboxIn(state: 'created' | 'running' | 'paused'): Promise<string> {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  if (state === 'created') return sandboxId;
  await stack.client.sandboxes.start(sandboxId);
  if (state === 'paused') await stack.client.sandboxes.pause(sandboxId);
  return sandboxId;
}

/** What a request may have changed: the Run, the sandbox (state and files), the workflows of the queue. */
async function world(runId: string, sandboxId: string): Promise<unknown> {
  const run = await stack.client.runs.get(runId);
  const sandbox = await stack.client.sandboxes.get(sandboxId).catch((err: { code: string }) => err.code);
  const files =
    typeof sandbox === 'object' && sandbox.state === 'running'
      ? (await stack.client.sandboxes.exec(sandboxId, { command: 'ls -A' })).stdout
      : undefined;
  const workflows: string[] = [];
  for await (const wf of stack.temporal.workflow.list({ query: `TaskQueue = '${stack.config.STASIS_TASK_QUEUE}'` }))
    workflows.push(wf.workflowId);
  return {
    run: { status: run.status, interactions: run.interactions.map((i) => i.status) },
    sandbox: typeof sandbox === 'object' ? sandbox.state : sandbox,
    files,
    workflows: workflows.sort(),
  };
}

const ACTIVE = { kind: 'active', hostPath: path.join(os.tmpdir(), `roles-active-${process.pid}`) };

interface Case {
  name: string;
  route: RouteDef;
  /** The least role the request needs (the route's, or admin for an active workspace). */
  needs: Role;
  /** It answers an interaction. */
  answers: boolean;
  body?: unknown;
  raw?: Buffer;
  /** A Run and a sandbox in the state this request works on. */
  needsRun?: 'waiting' | 'busy' | 'suspended' | 'external';
  needsSandbox?: 'created' | 'running' | 'paused';
}

/** A request for every route of the table that would succeed with the right role. */
function cases(): Case[] {
  const out: Case[] = [];
  for (const route of apiRoutes().filter((r) => !r.public)) {
    const role = route.role!;
    const answers = route.method === 'POST' && route.path === '/api/v1/runs/{id}/interactions/{iid}';
    const base = { name: `${route.method} ${route.path}`, route, needs: role, answers };
    const op = route.path.split('/').pop() ?? '';
    if (route.path === '/api/v1/runs' && route.method === 'POST') {
      const spec = { agent: { driver: 'scripted', steps: [{ complete: 1 }] }, sandbox: { provider: 'local' } };
      out.push({ ...base, body: spec });
      out.push({
        ...base,
        name: `${base.name} (active workspace)`,
        needs: 'admin',
        body: { ...spec, sandbox: { provider: 'local', workspace: ACTIVE } },
      });
    } else if (route.path === '/api/v1/sandboxes' && route.method === 'POST') {
      out.push({ ...base, body: { provider: 'local' } });
      out.push({
        ...base,
        name: `${base.name} (active workspace)`,
        needs: 'admin',
        body: { provider: 'local', workspace: ACTIVE },
      });
    } else if (route.path.startsWith('/api/v1/runs/{id}/actions')) {
      // An external agent's Run that already did action a1: sending it again returns its outcome.
      out.push({ ...base, body: route.method === 'POST' ? EXTERNAL_ACTION : undefined, needsRun: 'external' });
    } else if (route.path.startsWith('/api/v1/runs/{id}')) {
      const body = op === '{iid}' ? { decision: 'approve' } : undefined;
      out.push({ ...base, body, needsRun: op === 'resume' ? 'suspended' : op === 'suspend' ? 'busy' : 'waiting' });
    } else if (route.path.startsWith('/api/v1/sandboxes/{id}')) {
      const state = op === 'start' ? 'created' : op === 'resume' ? 'paused' : 'running';
      const body = op === 'exec' ? { command: 'touch executed' } : undefined;
      out.push({
        ...base,
        body,
        raw: route.body === 'bytes' ? Buffer.from('written') : undefined,
        needsSandbox: state,
      });
    } else out.push(base);
  }
  return out;
}

/**
 * The rule under test, written out: approver, operator and admin are ordered (the ladder of
 * `allows`); an agent may do what an operator may, except answer an interaction, so an AI
 * agent never approves what it asked a person to decide.
 */
function mayCall(role: Role, c: Case): boolean {
  if (role === 'agent') return c.needs !== 'admin' && !c.answers;
  return allows(role, c.needs);
}

test('every route × every role: the route does its job, or 403 FORBIDDEN as declared, and a 403 changes nothing', async () => {
  const table = cases();
  expect(table.length).toBeGreaterThanOrEqual(22);
  // Every role is both let in and refused somewhere: the table tests the rule, not one side of it.
  for (const role of ROLES.filter((r) => r !== 'admin')) expect(table.some((c) => !mayCall(role, c))).toBe(true);
  expect(table.filter((c) => c.answers)).toHaveLength(1);
  // Shared by the refused calls, which must not touch them.
  const shared = { runId: await waitingRun(), sandboxId: await sandboxIn('running') };
  await stack.client.sandboxes.exec(shared.sandboxId, { command: 'touch existing' });

  for (const c of table) {
    for (const role of ROLES) {
      const id = `${c.name} as ${role}`;
      const allowed = mayCall(role, c);
      tally.start(id, `${id}: ${allowed ? 'refused' : 'let in'}`);
      let runId = shared.runId;
      let sandboxId = shared.sandboxId;
      if (allowed && c.needsRun)
        runId =
          c.needsRun === 'waiting'
            ? await waitingRun()
            : c.needsRun === 'external'
              ? await externalRun()
              : await busyRun(c.needsRun === 'suspended');
      if (allowed && c.needsSandbox) sandboxId = await sandboxIn(c.needsSandbox);
      if (allowed && c.route.method === 'GET' && c.route.path.endsWith('/files'))
        await stack.client.sandboxes.writeFile(sandboxId, 'written.txt', Buffer.from('there'));
      const url =
        c.route.path
          .replace('/runs/{id}', `/runs/${runId}`)
          .replace('{iid}', 'int-1')
          .replace('{actionId}', 'a1')
          .replace('/sandboxes/{id}', `/sandboxes/${sandboxId}`) +
        (c.route.path.endsWith('/files') ? '?path=written.txt' : '');
      const options: CallOptions = c.raw ? { raw: c.raw } : c.body !== undefined ? { body: c.body } : {};
      if (!allowed) tally.inject();
      const before = allowed ? undefined : await world(shared.runId, shared.sandboxId);
      const response = await as(role)(c.route.method, url, options);
      if (allowed) {
        expect({ id, status: response.status, json: response.status >= 400 ? response.json : undefined }).toEqual({
          id,
          status: c.route.status,
          json: undefined,
        });
      } else {
        if (response.status !== 403) escapes += 1;
        // The route's own role is checked first (before the body is read), then what the body asks for.
        const refusedFor = allows(role, c.route.role!) ? c.needs : c.route.role!;
        const why =
          c.answers && role === 'agent'
            ? 'answers an interaction, which the agent role may not'
            : `needs the ${refusedFor} role`;
        expect({ id, status: response.status, json: response.json }).toEqual({
          id,
          status: 403,
          json: { error: { code: 'FORBIDDEN', message: expect.stringContaining(why) } },
        });
        expect({ id, world: await world(shared.runId, shared.sandboxId) }).toEqual({ id, world: before });
      }
      tally.ok(id);
    }
  }
  // The refused calls left the shared Run waiting and the sandbox untouched (no file was written, no command ran).
  expect(await world(shared.runId, shared.sandboxId)).toMatchObject({
    run: { status: 'WAITING', interactions: ['pending'] },
    sandbox: 'running',
    files: 'existing\n',
  });
}, 600_000);

/** The identity Temporal recorded on an event, by the event's kind. */
function identities(events: HistoryEvent[]): { kind: string; identity: string; update?: string }[] {
  return events.flatMap((e) => {
    if (e.workflowExecutionStartedEventAttributes)
      return [{ kind: 'started', identity: e.workflowExecutionStartedEventAttributes.identity ?? '' }];
    if (e.workflowExecutionCancelRequestedEventAttributes)
      return [{ kind: 'cancel', identity: e.workflowExecutionCancelRequestedEventAttributes.identity ?? '' }];
    if (e.workflowExecutionSignaledEventAttributes)
      return [{ kind: 'signal', identity: e.workflowExecutionSignaledEventAttributes.identity ?? '' }];
    const accepted = e.workflowExecutionUpdateAcceptedEventAttributes?.acceptedRequest;
    if (accepted)
      return [{ kind: 'update', identity: accepted.meta?.identity ?? '', update: accepted.input?.name ?? '' }];
    return [];
  });
}

test('who did what is on the history: start, answer, cancel, exec and file writes carry stasis-api:<token name>', async () => {
  const operator = `${API_IDENTITY_PREFIX}operator-1`;
  const approver = `${API_IDENTITY_PREFIX}approver-1`;
  const spec = {
    agent: { driver: 'scripted', steps: [{ ask: 'go?' }, { ask: 'sure?' }, { complete: 1 }] },
    sandbox: { provider: 'local' },
  };
  const started = await as('operator')('POST', '/api/v1/runs', { body: spec });
  expect(started.status).toBe(201);
  const { runId } = started.json as { runId: string };
  await eventually(async () => saw(await stack.client.runs.get(runId)).status === 'WAITING', 60_000, 'waiting');
  expect(
    (await as('approver')('POST', `/api/v1/runs/${runId}/interactions/int-1`, { body: { decision: 'approve' } }))
      .status,
  ).toBe(200);
  await eventually(
    async () => saw(await stack.client.runs.get(runId)).interactions.length === 2,
    60_000,
    'second question',
  );
  expect((await as('operator')('POST', `/api/v1/runs/${runId}/cancel`)).status).toBe(200);

  const created = await as('operator')('POST', '/api/v1/sandboxes', { body: { provider: 'local' } });
  const { sandboxId } = created.json as { sandboxId: string };
  expect((await as('admin')('POST', `/api/v1/sandboxes/${sandboxId}/start`)).status).toBe(200);
  expect(
    (await as('operator')('POST', `/api/v1/sandboxes/${sandboxId}/exec`, { body: { command: 'true' } })).status,
  ).toBe(200);
  expect(
    (await as('admin')('PUT', `/api/v1/sandboxes/${sandboxId}/files?path=a.txt`, { raw: Buffer.from('a') })).status,
  ).toBe(204);

  const run = identities(await historyEvents(stack.temporal, runId));
  expect(run).toEqual(
    expect.arrayContaining([
      { kind: 'started', identity: operator },
      { kind: 'update', identity: approver, update: 'respond' },
      { kind: 'cancel', identity: operator },
    ]),
  );
  const sandbox = identities(await historyEvents(stack.temporal, sandboxWorkflowId(sandboxId)));
  const admin = `${API_IDENTITY_PREFIX}admin-1`;
  expect(sandbox.find((e) => e.kind === 'started')).toEqual({ kind: 'started', identity: operator });
  const updates = Object.fromEntries(sandbox.filter((e) => e.kind === 'update').map((e) => [e.update, e.identity]));
  expect(updates).toMatchObject({ start: admin, exec: operator, writeFile: admin });
  await stack.client.sandboxes.destroy(sandboxId);
}, 180_000);

test('the worker refuses a host path outside STASIS_HOST_PATHS too: a Run or sandbox started straight through Temporal creates nothing', async () => {
  // Outside the test stack's STASIS_HOST_PATHS (the temporary directory); under / so the check, not a permission, refuses it.
  const outside = `/var/tmp/stasis-escape-${process.pid}-${Date.now()}`;
  const spec = {
    agent: { driver: 'scripted', steps: [{ exec: 'touch escaped' }, { complete: 1 }] },
    sandbox: { provider: 'local', workspace: { kind: 'active', hostPath: outside } },
  };
  // Through the typed client: refused before anything is started.
  await expect(stack.client.runs.start(spec)).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining('spec.sandbox.workspace.hostPath'),
  });
  // Straight through Temporal, as any client with access could: the worker's provision refuses it.
  const runId = `run-escape-${Date.now()}`;
  for (const hostPath of [outside, '/', `${os.tmpdir()}/../var/tmp/stasis-escape-${process.pid}`]) {
    const id = `${runId}-${ROLES.length}-${hostPath.length}`;
    tally.start(id, `${hostPath}: provisioned`);
    tally.inject();
    await stack.temporal.workflow.start('runWorkflow', {
      taskQueue: stack.config.STASIS_TASK_QUEUE,
      workflowId: id,
      args: [{ spec: { ...spec, sandbox: { provider: 'local', workspace: { kind: 'active', hostPath } } } }],
    });
    const failed = await eventually(
      async () => {
        const run = saw(await stack.client.runs.get(id));
        return run.status === 'FAILED' && run;
      },
      60_000,
      `${id} failed`,
    );
    expect(JSON.stringify(failed.error)).toContain('sandbox.workspace.hostPath');
    expect(existsSync(outside)).toBe(false);
    expect(existsSync('/escaped')).toBe(false);
    tally.ok(id);
  }
  // A standalone sandbox the same way: its start is refused and nothing is created.
  const sandboxId = `sbx-escape-${Date.now()}`;
  await stack.temporal.workflow.start('sandboxWorkflow', {
    taskQueue: stack.config.STASIS_TASK_QUEUE,
    workflowId: sandboxWorkflowId(sandboxId),
    args: [
      {
        sandboxId,
        create: { provider: 'local', workspace: { kind: 'active', hostPath: outside } },
        suspendedRetentionSeconds: 60,
      },
    ],
  });
  await expect(stack.client.sandboxes.start(sandboxId)).rejects.toBeDefined();
  // Why, on its history: the provision activity's non-retryable refusal naming the field.
  const failures = (await historyEvents(stack.temporal, sandboxWorkflowId(sandboxId)))
    .map((e) => e.activityTaskFailedEventAttributes?.failure)
    .filter((f) => f !== undefined && f !== null);
  expect(failures).toEqual([
    expect.objectContaining({ message: expect.stringContaining('sandbox.workspace.hostPath') }),
  ]);
  expect(existsSync(outside)).toBe(false);
}, 180_000);

test('summary: every refusal as declared, nothing changed by one', () => {
  writeSummary('roles', tally, { escapes });
  expect(tally.lostItems).toEqual([]);
  expect(escapes).toBe(0);
  expect(tally.trials).toBeGreaterThan(60);
});
