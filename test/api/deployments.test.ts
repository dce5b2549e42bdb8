import { Client, type WorkflowClientInterceptor } from '@temporalio/client';
import { buildApi } from '../../api/server';
import { StasisClient } from '../../client';
import { clientOptions } from '../../client/options';
import type { FastifyInstance } from 'fastify';
import { eventually, saw, startStack, type TestStack } from '../helpers/stack';
import { errorCode, errorMessage, listenOnLoopback, type HttpResult } from './http';

// Two Stasis deployments share one Temporal namespace, each on its own task queue. A client of one
// (so its REST API, CLI and MCP tools) acts only on its own Runs and sandboxes: one of the other
// deployment is NOT_FOUND by its id, as an unknown one, and nothing reaches it (no query, Update,
// signal, cancel or terminate; its history gains nothing). Was: an approver of A read and answered
// B's interaction, an operator of A exec'd into B's sandbox and destroyed it.

const ADMIN = { name: 'root-a', secret: 'admin-a-secret-0123456789', role: 'admin' } as const;

let a: TestStack;
let b: TestStack;
/** Deployment A's client over a Temporal client that records which workflow ids its calls reach. */
let clientA: StasisClient;
let app: FastifyInstance;
let http: Awaited<ReturnType<typeof listenOnLoopback>>;
/** `<call> <workflowId>` for each query, Update, signal, cancel and terminate A's client sent. */
const reached: string[] = [];

const recorder: WorkflowClientInterceptor = {
  query: (input, next) => (reached.push(`query ${input.workflowExecution.workflowId}`), next(input)),
  startUpdate: (input, next) => (reached.push(`update ${input.workflowExecution.workflowId}`), next(input)),
  signal: (input, next) => (reached.push(`signal ${input.workflowExecution.workflowId}`), next(input)),
  cancel: (input, next) => (reached.push(`cancel ${input.workflowExecution.workflowId}`), next(input)),
  terminate: (input, next) => (reached.push(`terminate ${input.workflowExecution.workflowId}`), next(input)),
};

beforeAll(async () => {
  [a, b] = await Promise.all([startStack(), startStack()]);
  const temporal = new Client({
    connection: a.temporal.connection,
    namespace: a.config.TEMPORAL_NAMESPACE,
    interceptors: { workflow: [recorder] },
  });
  clientA = new StasisClient(temporal, clientOptions(a.config));
  app = buildApi({ client: clientA, tokens: [ADMIN], logger: false });
  http = await listenOnLoopback(app);
}, 120_000);
afterAll(async () => {
  await app?.close();
  await Promise.all([a?.stop(), b?.stop()]);
});

const admin = (method: string, path: string, body?: unknown) =>
  http(method, path, { token: ADMIN.secret, ...(body === undefined ? {} : { body }) });
const brief = (r: HttpResult) => ({ status: r.status, code: errorCode(r), message: errorMessage(r) });

/** B's Runs and sandbox, each settled (nothing of its own under way), made once. */
interface Foreign {
  /** Waits on an ask, its sandbox released. */
  waiting: string;
  /** An external agent's Run that has done one action (`w`). */
  external: string;
  /** A running standalone sandbox. */
  sandboxId: string;
}
let foreign: Promise<Foreign> | undefined;

/** Made once for every test (a failure fails each at once, not after its own wait). */
const foreignTargets = (): Promise<Foreign> => (foreign ??= makeForeign());

async function makeForeign(): Promise<Foreign> {
  const { runId: waiting } = await b.client.runs.start({
    agent: { driver: 'scripted', steps: [{ ask: 'Deploy B to prod?' }, { complete: 'done' }] },
    sandbox: { provider: 'local' },
  });
  const { runId: external } = await b.client.runs.start({
    agent: { driver: 'external' },
    sandbox: { provider: 'local' },
  });
  const written = await b.client.runs.act(external, {
    actionId: 'w',
    action: { type: 'writeFile', path: 'b.txt', content: 'B' },
  });
  expect(written.status).toBe('succeeded');
  const { sandboxId } = await b.client.sandboxes.create({ provider: 'local' });
  await b.client.sandboxes.start(sandboxId);
  await eventually(
    async () => {
      const view = saw(await b.client.runs.resource(waiting));
      return view.phase === 'SUSPENDED' && view.record.state === 'RELEASED';
    },
    90_000,
    'B waiting, released',
  );
  return { waiting, external, sandboxId };
}

/** What a client does to a workflow that is kept in its history. */
const CLIENT_EVENTS = [
  'workflowExecutionSignaledEventAttributes',
  'workflowExecutionUpdateAdmittedEventAttributes',
  'workflowExecutionUpdateAcceptedEventAttributes',
  'workflowExecutionCancelRequestedEventAttributes',
  'workflowExecutionTerminatedEventAttributes',
] as const;

/** The events of B's workflow that a client caused, and its status. */
async function clientTrace(workflowId: string): Promise<string[]> {
  const handle = b.temporal.workflow.getHandle(workflowId);
  const { events } = await handle.fetchHistory();
  const caused = (events ?? []).flatMap((event) =>
    CLIENT_EVENTS.filter((key) => event[key] != null).map((key) => `${event.eventId} ${key}`),
  );
  return [...caused, `status ${(await handle.describe()).status.name}`];
}

/** What B sees of its own: the Runs' statuses and interactions, the sandbox's state and file. */
async function bView(f: Foreign) {
  const [waiting, external, sandbox] = await Promise.all([
    b.client.runs.get(f.waiting),
    b.client.runs.get(f.external),
    b.client.sandboxes.get(f.sandboxId),
  ]);
  return {
    waiting: { status: waiting.status, interactions: waiting.interactions.map((i) => [i.id, i.status]) },
    external: external.status,
    sandbox: sandbox.state,
    traces: await Promise.all(
      [f.waiting, f.external, `sandbox-${f.sandboxId}`].map(async (id) => [id, await clientTrace(id)]),
    ),
  };
}

type Call = [name: string, call: (f: Foreign) => Promise<unknown>, target: (f: Foreign) => string];
const run = (f: Foreign) => f.waiting;
const ext = (f: Foreign) => f.external;
const sbx = (f: Foreign) => f.sandboxId;
const answer = { decision: 'approve', comment: 'from deployment A' };

/** Every id-based method of the client, on the foreign workflow it names. */
const CLIENT_CALLS: Call[] = [
  ['runs.get', (f) => clientA.runs.get(f.waiting), run],
  ['runs.resource', (f) => clientA.runs.resource(f.waiting), run],
  ['runs.respond', (f) => clientA.runs.respond(f.waiting, 'int-1', answer, { respondedBy: 'ann' }), run],
  ['runs.respondBySignal', (f) => clientA.runs.respondBySignal(f.waiting, 'int-1', answer), run],
  ['runs.suspend', (f) => clientA.runs.suspend(f.waiting), run],
  ['runs.resume', (f) => clientA.runs.resume(f.waiting), run],
  ['runs.cancel', (f) => clientA.runs.cancel(f.waiting), run],
  ['runs.act', (f) => clientA.runs.act(f.external, { actionId: 'x', action: { type: 'complete' } }), ext],
  ['runs.action', (f) => clientA.runs.action(f.external, 'w'), ext],
  ['sandboxes.get', (f) => clientA.sandboxes.get(f.sandboxId), sbx],
  ['sandboxes.start', (f) => clientA.sandboxes.start(f.sandboxId), sbx],
  ['sandboxes.stop', (f) => clientA.sandboxes.stop(f.sandboxId), sbx],
  ['sandboxes.pause', (f) => clientA.sandboxes.pause(f.sandboxId), sbx],
  ['sandboxes.resume', (f) => clientA.sandboxes.resume(f.sandboxId), sbx],
  ['sandboxes.suspend', (f) => clientA.sandboxes.suspend(f.sandboxId), sbx],
  ['sandboxes.destroy', (f) => clientA.sandboxes.destroy(f.sandboxId), sbx],
  ['sandboxes.exec', (f) => clientA.sandboxes.exec(f.sandboxId, { command: 'echo A > a.txt' }), sbx],
  ['sandboxes.readFile', (f) => clientA.sandboxes.readFile(f.sandboxId, 'b.txt'), sbx],
  ['sandboxes.writeFile', (f) => clientA.sandboxes.writeFile(f.sandboxId, 'a.txt', Buffer.from('A')), sbx],
];

const notFound = (target: string) =>
  target.startsWith('sbx-') ? `sandbox ${target} not found` : `run ${target} not found`;

test.each(CLIENT_CALLS)(
  'client %s on another deployment’s workflow is NOT_FOUND, and nothing reaches it',
  async (_name, call, target) => {
    const f = await foreignTargets();
    const before = await bView(f);
    reached.length = 0;
    const err = await call(f).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toMatchObject({ code: 'NOT_FOUND', httpStatus: 404, message: notFound(target(f)) });
    expect(reached).toEqual([]);
    expect(await bView(f)).toEqual(before);
  },
  120_000,
);

test('the same calls on the deployment’s own Run and sandbox reach them (the check refuses only the foreign)', async () => {
  const { runId } = await a.client.runs.start({
    agent: { driver: 'scripted', steps: [{ ask: 'Deploy A?' }, { complete: 'done' }] },
    sandbox: { provider: 'local' },
  });
  await eventually(async () => saw(await clientA.runs.get(runId)).status === 'WAITING', 90_000, 'A waiting');
  expect((await admin('GET', `/api/v1/runs/${runId}`)).status).toBe(200);
  const answered = await admin('POST', `/api/v1/runs/${runId}/interactions/int-1`, answer);
  expect([answered.status, (answered.json as { status?: string }).status]).toEqual([200, 'answered']);
  const created = await admin('POST', '/api/v1/sandboxes', { provider: 'local' });
  const sandboxId = (created.json as { sandboxId: string }).sandboxId;
  expect((await admin('POST', `/api/v1/sandboxes/${sandboxId}/start`)).status).toBe(200);
  const ran = await admin('POST', `/api/v1/sandboxes/${sandboxId}/exec`, { command: 'echo ok' });
  expect([ran.status, (ran.json as { stdout?: string }).stdout]).toEqual([200, 'ok\n']);
  expect((await admin('DELETE', `/api/v1/sandboxes/${sandboxId}`)).status).toBe(200);
}, 180_000);

test('starting a Run under another deployment’s Run id is 409 naming only that the id is taken, and changes nothing', async () => {
  const f = await foreignTargets();
  const before = await bView(f);
  reached.length = 0;
  for (const runId of [f.waiting, f.external]) {
    const spec = { runId, agent: { driver: 'external' }, sandbox: { provider: 'local' } };
    const rest = await admin('POST', '/api/v1/runs', spec);
    const message = `run ${runId} already exists (a Run id is used once in the Temporal namespace, also after its Run ended)`;
    expect(brief(rest)).toEqual({ status: 409, code: 'ALREADY_EXISTS', message });
    await expect(clientA.runs.start(spec)).rejects.toMatchObject({ code: 'ALREADY_EXISTS', message });
  }
  expect(reached).toEqual([]);
  expect(await bView(f)).toEqual(before);
}, 120_000);

test('an id checked to be the deployment’s own, deleted and started again by another deployment, is NOT_FOUND and untouched', async () => {
  // A's client remembers the chain of a Run it started; once Temporal deleted that Run (its retention), the
  // id is free in the namespace and B starts a Run under it. A's Updates stay bound to its own chain.
  const runId = `reused-across-${Date.now().toString(36)}`;
  await clientA.runs.start({
    runId,
    agent: { driver: 'scripted', steps: [{ complete: 'a' }] },
    sandbox: { provider: 'local' },
  });
  await eventually(async () => saw(await clientA.runs.get(runId)).status === 'COMPLETED', 60_000, 'A completed');
  await a.temporal.workflowService.deleteWorkflowExecution({
    namespace: a.config.TEMPORAL_NAMESPACE,
    workflowExecution: { workflowId: runId },
  });
  await eventually(
    async () => (await clientA.runs.get(runId).catch((e: { code?: string }) => e.code)) === 'NOT_FOUND',
    60_000,
    'A deleted',
  );
  await b.client.runs.start({
    runId,
    agent: { driver: 'scripted', steps: [{ ask: 'B reused the id?' }, { complete: 'b' }] },
    sandbox: { provider: 'local' },
  });
  await eventually(async () => saw(await b.client.runs.get(runId)).status === 'WAITING', 90_000, 'B waiting');
  const before = await clientTrace(runId);
  for (const call of [
    () => clientA.runs.respond(runId, 'int-1', answer),
    () => clientA.runs.suspend(runId),
    () => clientA.runs.cancel(runId),
    () => clientA.runs.get(runId),
  ])
    await expect(call()).rejects.toMatchObject({ code: 'NOT_FOUND', message: `run ${runId} not found` });
  expect(await clientTrace(runId)).toEqual(before);
  expect((await b.client.runs.get(runId)).interactions).toMatchObject([{ id: 'int-1', status: 'pending' }]);
}, 180_000);
