import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { ErrorCode, McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import * as fc from 'fast-check';
import type { FastifyInstance } from 'fastify';
import { buildApi } from '../../api/server';
import { toStasisError } from '../../client/errors';
import { ERROR_STATUS, isErrorCode } from '../../common/errors';
import { ApiClient } from '../../mcp/api-client';
import { createMcpServer } from '../../mcp/server';
import { spawnerPid } from '../../providers/spawner';
import { httpClient, type HttpResult } from '../api/http';
import { eventually, saw, startStack, unprintedWorkerLogs, workerLogs, type TestStack } from '../helpers/stack';
import { failedWorkflowTasks, historyEvents, Tally, writeSummary } from './helpers';
import {
  badJsonText,
  badWorkspacePath,
  createSandboxInput,
  execInput,
  hasLoneSurrogate,
  idBad,
  interactionResponse,
  invalid,
  invalidArgs,
  readFileInput,
  respondInput,
  runSpec,
  writeFileInput,
  type RawBody,
  type Shape,
} from './wire';

// Area 2, bad input. fast-check draws requests from the wire format (JSON and
// HTTP shapes written down in ./wire.ts from the documentation, never from the
// product's schemas), each breaking one documented rule, and sends them raw:
// as Updates and signals straight through the Temporal client (past the typed
// client's checks) to a waiting Run and a running sandbox, to every REST route,
// and to every MCP tool. Every one must be refused in the contract's terms
// (REST: a 4xx `{error: {code, message}}` with a code of the error table; an
// Update: rejected with an error type of the table, nothing written to history;
// MCP: an isError result carrying `{error: {code, message}}`), nothing may change
// (the Run, the sandbox, its files and processes, the workflows on the queue),
// and nobody may crash (the worker, its process starter, the API).

const RUNS = { update: 40, signal: 40, rest: 300, mcp: 160 };
const SECRET = 'fuzz-secret-0123456789abcdef';
/**
 * The refusals bad input may get: a 400 naming the field, 404 for what does not exist, 413 for too
 * much, 403 for a host path outside STASIS_HOST_PATHS.
 */
const REFUSALS = ['INVALID_ARGUMENT', 'NOT_FOUND', 'PAYLOAD_TOO_LARGE', 'FORBIDDEN'];

let stack: TestStack;
let app: FastifyInstance;
let call: ReturnType<typeof httpClient>;
let mcp: McpClient;
let runId: string;
let sandboxId: string;
const tally = new Tally();
const refusedCodes = new Map<string, number>();
const counts = { updates: 0, signals: 0, rest: 0, mcp: 0 };

beforeAll(async () => {
  unprintedWorkerLogs.push(/respondSignal rejected|childState rejected|reconcile rejected/);
  stack = await startStack();
  // An admin: every route and tool is open to it, so each refusal is about the input.
  app = buildApi({ client: stack.client, tokens: [{ name: 'fuzzer', secret: SECRET, role: 'admin' }], logger: false });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  const base = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
  call = httpClient(base);
  // The MCP server as `stasis mcp` runs it, a client of this API with the token.
  const api = new ApiClient({ url: base, token: SECRET });
  const [serverSide, clientSide] = InMemoryTransport.createLinkedPair();
  await createMcpServer(api, await api.me()).connect(serverSide);
  mcp = new McpClient({ name: 'fuzz', version: '1.0.0' });
  await mcp.connect(clientSide);

  ({ runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        { writeFile: { path: 'kept.txt', content: 'kept' } },
        { ask: 'fuzz me?' },
        { expectFile: { path: 'kept.txt', content: 'kept' } },
        { complete: 'done' },
      ],
    },
    sandbox: { provider: 'local' },
  }));
  await eventually(
    async () => saw(await stack.client.runs.resource(runId)).record.state === 'RELEASED',
    60_000,
    'run released',
  );
  ({ sandboxId } = await stack.client.sandboxes.create({ provider: 'local' }));
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.writeFile(sandboxId, 'keep.txt', Buffer.from('keep me'));
  // A directory, and a symlink to the host's root that a path may try to go through.
  await stack.client.sandboxes.exec(sandboxId, { command: 'mkdir dir && ln -s / hostlink' });
}, 180_000);

afterAll(async () => {
  await mcp?.close();
  await app?.close();
  await stack?.stop();
});

// ------------------------------------------------------------------ what must not change

/** Every entry under a directory with its kind and content hash, never following a symlink. */
function tree(root: string): Record<string, string> {
  const entries: Record<string, string> = {};
  const walk = (dir: string) => {
    for (const name of fs.readdirSync(dir)) {
      const full = path.join(dir, name);
      const rel = path.relative(root, full);
      const stat = fs.lstatSync(full);
      if (stat.isSymbolicLink()) entries[rel] = `link ${fs.readlinkSync(full)}`;
      else if (stat.isDirectory()) {
        entries[rel] = 'dir';
        walk(full);
      } else entries[rel] = `file ${createHash('sha256').update(fs.readFileSync(full)).digest('hex')}`;
    }
  };
  walk(root);
  return entries;
}

async function workflowsOnQueue(): Promise<number> {
  return (await stack.temporal.workflow.count(`TaskQueue = '${stack.config.STASIS_TASK_QUEUE}'`)).count;
}

/** What must not change: the user, operator and sandbox views, the workspaces, processes, workflows, the starter. */
async function observable() {
  const sandboxes = path.join(stack.config.STASIS_DATA_DIR, 'hosts', 'host-a', 'sandboxes');
  return {
    run: await stack.client.runs.get(runId),
    resource: await stack.client.runs.resource(runId),
    sandbox: await stack.client.sandboxes.get(sandboxId),
    workspaces: tree(sandboxes),
    processes: await stack.workers.get('host-a')!.registry.get('local').processCount(sandboxId),
    workflows: await workflowsOnQueue(),
    starter: spawnerPid(),
  };
}

const sandboxWf = () => `sandbox-${sandboxId}`;

// ------------------------------------------------------------------ judging

interface Refusal {
  code: string;
  message: string;
}

/**
 * Counts a case as a trial, verified when it was refused with a code of `codes` and a message.
 * A case that was not stays open, and the summary lists it (every case runs: one bad answer does not hide the next).
 */
function judge(what: string, refusal: Refusal | undefined, codes = REFUSALS): void {
  const id = `${what} #${tally.trials}`;
  tally.start(id, `${what}: ${refusal ? `${refusal.code} ${refusal.message}` : 'not refused as documented'}`);
  tally.inject();
  if (!refusal || !codes.includes(refusal.code) || refusal.message.length === 0) return;
  refusedCodes.set(refusal.code, (refusedCodes.get(refusal.code) ?? 0) + 1);
  tally.ok(id);
}

const show = (value: unknown): string => {
  const json = JSON.stringify(value) ?? String(value);
  return json.length > 240 ? `${json.slice(0, 240)}… (${json.length} chars)` : json;
};

// ------------------------------------------------------------------ Updates and signals

/** Sends an Update exactly as given; its refusal, or undefined when it was accepted. */
async function rawUpdate(workflowId: string, name: string, args: unknown[]): Promise<Refusal | undefined> {
  try {
    const handle = stack.temporal.workflow.getHandle(workflowId);
    if (args.length === 0) await handle.executeUpdate(name);
    else await handle.executeUpdate(name, { args: args as [unknown, ...unknown[]] });
    return undefined;
  } catch (err) {
    const failure = toStasisError(err, name);
    return { code: failure.code, message: failure.message };
  }
}

/** Temporal carries payloads as UTF-8: a lone surrogate arrives as U+FFFD, so such cases are for HTTP and MCP only. */
const overTemporal = (args: fc.Arbitrary<unknown[]>) => args.filter((a) => !hasLoneSurrogate(a));

async function fuzzUpdate(workflowId: string, name: string, shape: Shape | undefined): Promise<void> {
  await fc.assert(
    fc.asyncProperty(overTemporal(invalidArgs(shape)), async (args) => {
      counts.updates += 1;
      judge(`Update ${name} ${show(args)}`, await rawUpdate(workflowId, name, args));
    }),
    { numRuns: RUNS.update },
  );
}

const RESOURCE_STATES = [
  'PROVISIONING',
  'ACTIVE',
  'RELEASING',
  'RELEASE_BLOCKED',
  'RETAINED',
  'RELEASED',
  'RESTORING',
  'DESTROYED',
];
const enumOf = (values: string[]): Shape => ({
  t: 'str',
  good: fc.constantFrom(...values),
  bad: fc.constantFrom('', 'active', `${values[0]} `),
});
/** The internal signals, as documented in workflows/definitions.ts. */
const childStateShape: Shape = {
  t: 'obj',
  fields: {
    runId: { shape: { t: 'str', good: fc.constant('fuzz-child'), bad: fc.constant('') } },
    state: { shape: enumOf(RESOURCE_STATES) },
    status: { shape: enumOf(['RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'CANCELLED', 'EXPIRED']), optional: true },
  },
};
const reconcileShape: Shape = {
  t: 'obj',
  fields: {
    hostId: { shape: { t: 'str', good: fc.constant('host-a'), bad: fc.constant('') } },
    alive: { shape: { t: 'bool' } },
  },
};

/** A signal cannot answer: its refusal is the worker's log line; its effect, none (checked at the end). */
async function fuzzSignal(workflowId: string, name: string, shape: Shape, logLine: string): Promise<void> {
  const logged = () => workerLogs.filter((e) => e.message === logLine).length;
  const before = logged();
  const ids: string[] = [];
  await fc.assert(
    fc.asyncProperty(overTemporal(invalid(shape).map((v) => [v])), async ([payload]) => {
      await stack.temporal.workflow.getHandle(workflowId).signal(name, payload);
      counts.signals += 1;
      const id = `signal ${name} ${counts.signals}`;
      ids.push(id);
      tally.start(id, `signal ${name} ${show(payload)}: not logged as rejected`);
      tally.inject();
    }),
    { numRuns: RUNS.signal },
  );
  await eventually(async () => logged() - before >= ids.length, 30_000, `${ids.length} ${name} rejections logged`);
  for (const id of ids) tally.ok(id);
}

test('malformed Updates and signals are refused before history; nothing changes', async () => {
  const before = await observable();
  const runHistory = await historyEvents(stack.temporal, runId);
  const sandboxHistory = await historyEvents(stack.temporal, sandboxWf());

  await fuzzUpdate(runId, 'respond', respondInput('int-1'));
  await fuzzUpdate(runId, 'suspend', undefined);
  await fuzzUpdate(runId, 'resume', undefined);
  for (const change of ['start', 'stop', 'pause', 'resume', 'suspend', 'destroy', 'ready']) {
    await fuzzUpdate(sandboxWf(), change, undefined);
  }
  const workspaceFile = fc.constantFrom('keep.txt', 'dir/x.txt', '\u202etxt.exe');
  await fuzzUpdate(sandboxWf(), 'exec', execInput);
  await fuzzUpdate(sandboxWf(), 'readFile', readFileInput(workspaceFile));
  await fuzzUpdate(sandboxWf(), 'writeFile', writeFileInput(workspaceFile));

  await fuzzSignal(runId, 'respondSignal', respondInput('int-1'), 'respondSignal rejected');
  await fuzzSignal(runId, 'childState', childStateShape, 'childState rejected');
  await fuzzSignal(sandboxWf(), 'reconcile', reconcileShape, 'reconcile rejected');

  expect(await observable()).toEqual(before);
  const runAfter = await historyEvents(stack.temporal, runId);
  const sandboxAfter = await historyEvents(stack.temporal, sandboxWf());
  for (const events of [runAfter, sandboxAfter]) expect(failedWorkflowTasks(events)).toEqual([]);
  // A signal is always recorded; a refused Update never is.
  const signaled = (events: typeof runAfter) => events.filter((e) => e.workflowExecutionSignaledEventAttributes).length;
  const others = (events: typeof runAfter) =>
    events.filter(
      (e) =>
        !e.workflowExecutionSignaledEventAttributes &&
        !e.workflowTaskScheduledEventAttributes &&
        !e.workflowTaskStartedEventAttributes &&
        !e.workflowTaskCompletedEventAttributes,
    );
  expect(signaled(runAfter) - signaled(runHistory)).toBe(2 * RUNS.signal);
  expect(signaled(sandboxAfter) - signaled(sandboxHistory)).toBe(RUNS.signal);
  expect(others(runAfter)).toEqual(others(runHistory));
  expect(others(sandboxAfter)).toEqual(others(sandboxHistory));
}, 600_000);

// ------------------------------------------------------------------ REST

interface RestRequest {
  method: string;
  path: string;
  json?: unknown;
  raw?: RawBody;
}

/** Percent-encodes as a URL carries it; a lone surrogate as the (invalid UTF-8) bytes of its code unit. */
const seg = (value: string): string =>
  value.replace(/[\s\S]/gu, (ch) =>
    ch.length === 1 && ch >= '\ud800' && ch <= '\udfff'
      ? [0xe0 | (ch.charCodeAt(0) >> 12), 0x80 | ((ch.charCodeAt(0) >> 6) & 0x3f), 0x80 | (ch.charCodeAt(0) & 0x3f)]
          .map((b) => `%${b.toString(16).toUpperCase()}`)
          .join('')
      : encodeURIComponent(ch),
  );
const rawJson = (raw: RawBody) => ({ raw });
/** A JSON body with one rule broken: of the shape, of JSON, or of HTTP. */
const badBody = (shape: Shape): fc.Arbitrary<Pick<RestRequest, 'json' | 'raw'>> =>
  fc.oneof(
    { weight: 4, arbitrary: invalid(shape).map((json) => ({ json })) },
    { weight: 1, arbitrary: badJsonText(shape).map(rawJson) },
  );
const NO_BODY: Shape = { t: 'obj', fields: {} };
/** An id no route takes: malformed (400), or well-formed and unknown (404). */
const badIdSegment = fc.oneof(
  idBad.filter((id) => id !== '').map(seg),
  fc.constantFrom('r%ED%A0%80', '..', '.', '%2e%2e', '..%2f..%2fetc', '%00', '%', '%E0%A4%A', 'a%2Fb', 'unknown-id-0'),
);
/** A `path=` query no file route takes: path tricks, encoded or raw, repeated, or missing. */
const badPathQuery = fc.oneof(
  { weight: 3, arbitrary: badWorkspacePath.map((p) => `path=${seg(p)}`) },
  fc.constantFrom(
    'path=%2e%2e%2fetc%2fpasswd',
    'path=..%2F..%2Fetc',
    'path=%2Fetc%2Fpasswd',
    'path=keep.txt&path=keep.txt',
    'path[]=keep.txt',
    'path[a]=keep.txt',
    'path=',
    'path=%00',
    'path=%ZZ',
    'path=keep.txt%00.png',
    'Path=keep.txt',
    'path=hostlink%2Fetc%2Fhostname',
  ),
);
const badQuery = fc.constantFrom(
  'limit=0',
  'limit=-1',
  'limit=1001',
  'limit=1.5',
  'limit=0x10',
  'limit=1e2',
  'limit=%205',
  'limit=',
  'limit=1&limit=2',
  'status=waiting',
  'status=WAITING%00',
  'status=',
  'status=WAITING&status=RUNNING',
);

function restCases(): fc.Arbitrary<RestRequest> {
  const run = `/api/v1/runs/${runId}`;
  const box = `/api/v1/sandboxes/${sandboxId}`;
  const post = (p: string) => (b: Pick<RestRequest, 'json' | 'raw'>) => ({ method: 'POST', path: p, ...b });
  return fc.oneof(
    { weight: 3, arbitrary: badBody(runSpec).map(post('/api/v1/runs')) },
    badQuery.map((q) => ({ method: 'GET', path: `/api/v1/runs?${q}` })),
    fc.tuple(badIdSegment, fc.constantFrom('', '/resource', '/suspend', '/resume', '/cancel')).map(([id, tail]) => ({
      method: tail === '' || tail === '/resource' ? 'GET' : 'POST',
      path: `/api/v1/runs/${id}${tail}`,
    })),
    { weight: 2, arbitrary: badBody(interactionResponse).map(post(`${run}/interactions/int-1`)) },
    fc.tuple(badIdSegment, fc.boolean()).map(([id, inRun]) => ({
      method: 'POST',
      path: inRun ? `${run}/interactions/${id}` : `/api/v1/runs/${id}/interactions/int-1`,
      json: { decision: 'approve' },
    })),
    fc
      .tuple(fc.constantFrom('suspend', 'resume', 'cancel'), badBody(NO_BODY))
      .map(([op, b]) => post(`${run}/${op}`)(b)),
    { weight: 2, arbitrary: badBody(createSandboxInput).map(post('/api/v1/sandboxes')) },
    fc
      .tuple(badIdSegment, fc.constantFrom('', '/start', '/stop', '/pause', '/resume', '/suspend', '/exec', '/files'))
      .map(([id, tail]) => ({
        method: tail === '' || tail === '/files' ? (tail === '' ? 'DELETE' : 'GET') : 'POST',
        path: `/api/v1/sandboxes/${id}${tail}${tail === '/files' ? '?path=keep.txt' : ''}`,
      })),
    fc
      .tuple(fc.constantFrom('start', 'stop', 'pause', 'resume', 'suspend'), badBody(NO_BODY))
      .map(([op, b]) => post(`${box}/${op}`)(b)),
    badBody(NO_BODY).map((b) => ({ method: 'DELETE', path: box, ...b })),
    { weight: 3, arbitrary: badBody(execInput).map(post(`${box}/exec`)) },
    { weight: 2, arbitrary: badPathQuery.map((q) => ({ method: 'GET', path: `${box}/files?${q}` })) },
    {
      weight: 2,
      arbitrary: fc
        .tuple(
          badPathQuery,
          fc.uint8Array({ maxLength: 64 }),
          fc.constantFrom('application/octet-stream', 'text/plain', 'application/json'),
        )
        .map(([q, bytes, contentType]) => ({
          method: 'PUT',
          path: `${box}/files?${q}`,
          raw: { body: Buffer.from(bytes), contentType },
        })),
    },
    // A good path with content over the 1 MiB file limit.
    fc.constantFrom(1024 * 1024 + 1, 3 * 1024 * 1024).map((size) => ({
      method: 'PUT',
      path: `${box}/files?path=fuzz-big.bin`,
      raw: { body: Buffer.alloc(size, 7), contentType: 'application/octet-stream' },
    })),
    fc
      .tuple(fc.constantFrom('PATCH', 'PUT', 'DELETE'), fc.constantFrom('/api/v1/runs', `${run}/cancel`, `${box}/exec`))
      .map(([method, p]) => ({ method, path: p, json: {} })),
  );
}

async function send(request: RestRequest): Promise<HttpResult> {
  return call(request.method, request.path, {
    token: SECRET,
    ...(request.json !== undefined ? { body: request.json } : {}),
    ...(request.raw ? { raw: request.raw.body, contentType: request.raw.contentType } : {}),
  });
}

/** A REST refusal in the contract's terms: a 4xx of the error table, its code's status, a message naming what is wrong. */
function restRefusal(response: HttpResult): Refusal | undefined {
  const body = response.json as { error?: { code?: unknown; message?: unknown } } | undefined;
  const code = body?.error?.code;
  const message = body?.error?.message;
  if (response.status < 400 || response.status >= 500 || !isErrorCode(code) || ERROR_STATUS[code] !== response.status)
    return undefined;
  if (typeof message !== 'string') return undefined;
  // A 400 names the part of the request that is wrong.
  if (code === 'INVALID_ARGUMENT' && !/^(body|params|query)\b|^(\w+: )?path\b/.test(message)) return undefined;
  return { code, message };
}

test('malformed REST requests to every route are refused with a documented 4xx; nothing changes', async () => {
  const before = await observable();
  await fc.assert(
    fc.asyncProperty(restCases(), async (request) => {
      counts.rest += 1;
      const response = await send(request);
      const sent =
        request.json !== undefined
          ? show(request.json)
          : request.raw
            ? `${request.raw.contentType} ${show(String(request.raw.body))}`
            : '';
      judge(`REST ${request.method} ${request.path.slice(0, 160)} ${sent} → ${response.status}`, restRefusal(response));
      // Still serving: a control request answers.
      if (counts.rest % 50 === 0)
        expect((await call('GET', `/api/v1/runs/${runId}`, { token: SECRET })).status).toBe(200);
    }),
    { numRuns: RUNS.rest },
  );
  // (The sandbox's history may grow: a path through a symlink is only found out by the file activity.)
  expect(await observable()).toEqual(before);
}, 600_000);

// ------------------------------------------------------------------ MCP

interface McpCase {
  tool: string;
  args: unknown;
}

const idShape = (good: string): Shape => ({ t: 'str', good: fc.constant(good), bad: idBad });
const toolArgs = (fields: Record<string, Shape>): Shape => ({
  t: 'obj',
  fields: Object.fromEntries(Object.entries(fields).map(([k, shape]) => [k, { shape }])),
});

function mcpCases(): fc.Arbitrary<McpCase> {
  const sandboxRef = toolArgs({ sandboxId: idShape(sandboxId) });
  const execArgs = execInput as Extract<Shape, { t: 'obj' }>;
  const tools: Record<string, Shape> = {
    run_start: toolArgs({ spec: runSpec }),
    run_status: toolArgs({ runId: idShape(runId) }),
    interaction_respond: toolArgs({
      runId: idShape(runId),
      interactionId: idShape('int-1'),
      response: interactionResponse,
    }),
    sandbox_create: createSandboxInput,
    sandbox_exec: { t: 'obj', fields: { ...execArgs.fields, sandboxId: { shape: idShape(sandboxId) } } },
    sandbox_suspend: sandboxRef,
    sandbox_resume: sandboxRef,
    sandbox_destroy: sandboxRef,
  };
  return fc.oneof(
    ...Object.entries(tools).map(([tool, shape]) => invalid(shape).map((args) => ({ tool, args }))),
    fc.constantFrom('nope', '', 'run_start\0').map((tool) => ({ tool, args: {} })),
  );
}

/** An MCP refusal in the contract's terms: an isError result whose text is `{error: {code, message}}`. */
function mcpRefusal(result: CallToolResult): Refusal | undefined {
  if (!result.isError) return undefined;
  const first = result.content[0];
  if (first?.type !== 'text') return undefined;
  try {
    const { error } = JSON.parse(first.text) as { error?: { code?: unknown; message?: unknown } };
    return isErrorCode(error?.code) && typeof error.message === 'string'
      ? { code: error.code, message: error.message }
      : undefined;
  } catch {
    return undefined;
  }
}

test('malformed MCP tool calls are refused with {error: {code, message}}; nothing changes', async () => {
  const before = await observable();
  await fc.assert(
    fc.asyncProperty(mcpCases(), async ({ tool, args }) => {
      counts.mcp += 1;
      let refusal: Refusal | undefined;
      let answer: string;
      try {
        const result = (await mcp.callTool({
          name: tool,
          arguments: args as Record<string, unknown>,
        })) as CallToolResult;
        refusal = mcpRefusal(result);
        answer = result.content[0]?.type === 'text' ? result.content[0].text.slice(0, 200) : 'no text';
      } catch (err) {
        // Arguments that are not an object do not make a tools/call request: the protocol's
        // own refusal, a JSON-RPC "Invalid params" error, is the documented answer.
        const notAnObject = typeof args !== 'object' || args === null || Array.isArray(args);
        if (notAnObject && err instanceof McpError && err.code === ErrorCode.InvalidParams)
          refusal = { code: 'INVALID_ARGUMENT', message: err.message };
        answer = `threw ${String(err)}`;
      }
      judge(`MCP ${tool} ${show(args)} → ${answer}`, refusal);
    }),
    { numRuns: RUNS.mcp },
  );
  expect(await observable()).toEqual(before);
}, 600_000);

// Kept from the earlier fuzzer: URLs the router refuses before any route.
test('URLs the router itself refuses keep the contract: 401 without a token, else 400 {error}; every valid id reaches its route', async () => {
  const cases: [string, number, string][] = [
    ['/api/v1/runs/%E0%A4%A', 400, 'INVALID_ARGUMENT'],
    [`/api/v1/runs/${'r'.repeat(600)}`, 400, 'INVALID_ARGUMENT'],
    [`/api/v1/runs/${'r'.repeat(128)}`, 404, 'NOT_FOUND'],
    [`/api/v1/sandboxes/${'s'.repeat(128)}/files?path=a`, 404, 'NOT_FOUND'],
  ];
  for (const [url, status, code] of cases) {
    const signed = await call('GET', url, { token: SECRET });
    expect({ url, status: signed.status, json: signed.json }).toEqual({
      url,
      status,
      json: { error: { code, message: expect.any(String) } },
    });
    const anonymous = await call('GET', url);
    expect({ url, status: anonymous.status, json: anonymous.json }).toEqual({
      url,
      status: 401,
      json: { error: { code: 'UNAUTHORIZED', message: expect.any(String) } },
    });
  }
  expect((await call('GET', '/%E0%A4%A')).status).toBe(400);
});

// ------------------------------------------------------------------ afterwards

test('afterwards the Run and the sandbox still work, and the process starter is the one from before', async () => {
  const starter = spawnerPid();
  await expect(
    stack.client.sandboxes.exec(sandboxId, { command: 'cat keep.txt; echo; ls; test ! -e fuzz-ran.txt' }),
  ).resolves.toMatchObject({ exitCode: 0, stdout: 'keep me\ndir\nhostlink\nkeep.txt\n' });
  expect(spawnerPid()).toBe(starter);
  await stack.client.sandboxes.destroy(sandboxId);
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
}, 180_000);

test('summary: every malformed request refused, nothing changed, nobody crashed', () => {
  writeSummary('bad-input', tally, { ...counts, codes: [...refusedCodes].map(([c, n]) => `${c}:${n}`).join(',') });
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBeGreaterThanOrEqual(1_000);
});
