import * as fs from 'node:fs';
import * as path from 'node:path';
import * as fc from 'fast-check';
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { buildApi } from '../../api/server';
import { ListRunsQuery } from '../../api/schemas';
import { toStasisError } from '../../client/errors';
import { ERROR_STATUS, isErrorCode } from '../../common/errors';
import {
  CreateSandboxInput,
  ExecInput,
  Identifier,
  InteractionResponse,
  ReadFileInput,
  RespondInput,
  RunSpec,
  WorkspacePath,
  WriteFileInput,
} from '../../common/schemas';
import { httpClient, type HttpResult } from '../api/http';
import { eventually, saw, startStack, unprintedWorkerLogs, workerLogs, type TestStack } from '../helpers/stack';
import { failedWorkflowTasks, historyEvents, Tally, writeSummary, type HistoryEvent } from './helpers';

// Area 2, bad input: fast-check generates malformed payloads and throws them,
// raw (past the typed client's zod check), at every Update of a Run and of a
// standalone sandbox, at the respondSignal signal, and at every REST route that
// takes input. One waiting Run and one running sandbox take them all. Every
// payload must be refused with a clear error (REST: 4xx {error: {code, message}}),
// no workflow task may fail, and neither the Run nor the sandbox may change.

const UPDATE_RUNS = {
  respond: 80,
  runSuspend: 30,
  runResume: 30,
  sandboxChange: 30,
  exec: 80,
  readFile: 60,
  writeFile: 80,
};
const SIGNAL_RUNS = 100;
const REST_RUNS = 500;
const SECRET = 'fuzz-secret-0123456789abcdef';

let stack: TestStack;
let app: FastifyInstance;
let call: ReturnType<typeof httpClient>;
let runId: string;
let sandboxId: string;
const tally = new Tally();
const refusedCodes = new Map<string, number>();

/** The JSON the wire carries: what the workflow and the API actually receive. */
const wire = (value: unknown): unknown =>
  value === undefined ? undefined : (JSON.parse(JSON.stringify(value)) as unknown);
const rejectedBy = (schema: z.ZodType) => (value: unknown) => !schema.safeParse(wire(value)).success;

const junk = fc.jsonValue({ maxDepth: 3 });
const junkString = fc.oneof(
  fc.string(),
  fc.string({ unit: 'grapheme' }),
  fc.constantFrom('', ' ', '\0', '../../etc/passwd', '/etc/passwd', 'a/../../b', '..', '%2e%2e', 'x'.repeat(5000)),
);
const nonString = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.array(junk, { maxLength: 3 }),
  fc.dictionary(fc.string(), junk, { maxKeys: 3 }),
);
/**
 * The payload as the one argument, or followed by an extra one; and a valid
 * payload followed by an extra argument (an update takes exactly its arguments).
 */
const withArity = (payload: fc.Arbitrary<unknown>, valid: unknown): fc.Arbitrary<unknown[]> =>
  fc.oneof(
    { weight: 6, arbitrary: payload.map((p) => [p]) },
    { weight: 1, arbitrary: fc.tuple(payload, junk) },
    { weight: 1, arbitrary: fc.tuple(fc.constant(valid), junk) },
  );
/** Adds an unknown field to an object (strict schemas refuse it). */
const extraField = fc.tuple(
  fc
    .string({ minLength: 1 })
    .filter(
      (k) =>
        !['path', 'contentBase64', 'command', 'timeoutMs', 'env', 'interactionId', 'response', 'respondedBy'].includes(
          k,
        ),
    ),
  junk,
);

const respondPayload = fc.oneof(
  junk,
  fc.record(
    {
      interactionId: fc.oneof(fc.constant('int-1'), fc.constant('int-2'), junkString, nonString),
      response: fc.oneof(
        fc.record(
          {
            decision: fc.oneof(fc.constantFrom('approve', 'deny', 'APPROVE', 'maybe', ''), nonString),
            comment: fc.oneof(junkString, nonString, fc.constant('x'.repeat(10_001))),
          },
          { requiredKeys: [] },
        ),
        fc.record({ input: fc.oneof(nonString, fc.string()) }, { requiredKeys: [] }),
        fc.record({ decision: fc.constant('approve'), input: fc.string() }),
        junk,
      ),
      respondedBy: fc.oneof(fc.constant(''), fc.constant('x'.repeat(257)), nonString, fc.string()),
    },
    { requiredKeys: [] },
  ),
  fc
    .tuple(fc.constant({ interactionId: 'int-1', response: { decision: 'approve' } }), extraField)
    .map(([p, [k, v]]) => ({ ...p, [k]: v })),
);
const execPayload = fc.oneof(
  junk,
  fc.record(
    {
      command: fc.oneof(fc.constant(''), nonString, fc.string(), fc.constant('x'.repeat(1_000_001))),
      timeoutMs: fc.oneof(fc.constantFrom(0, -1, 1.5, 86_400_001, Number.MAX_SAFE_INTEGER), fc.string(), nonString),
      env: fc.oneof(
        fc.dictionary(fc.string(), junk, { maxKeys: 3 }),
        fc.constant({ '1BAD': 'x' }),
        fc.constant({ 'A-B': 'x' }),
        fc.constant({ GOOD: 5 }),
        nonString,
      ),
    },
    { requiredKeys: [] },
  ),
  fc
    .tuple(fc.constant({ command: 'echo should-not-run > ran.txt' }), extraField)
    .map(([p, [k, v]]) => ({ ...p, [k]: v })),
);
const badPath = fc.oneof(junkString, nonString, fc.constantFrom('/abs/file', 'a/../b', '../up', 'a\0b', ''));
const readPayload = fc.oneof(
  junk,
  fc.record({ path: badPath }, { requiredKeys: [] }),
  fc.tuple(fc.constant({ path: 'keep.txt' }), extraField).map(([p, [k, v]]) => ({ ...p, [k]: v })),
);
const writePayload = fc.oneof(
  junk,
  fc.record(
    {
      path: fc.oneof(badPath, fc.constant('fuzz.txt')),
      contentBase64: fc.oneof(nonString, fc.string(), fc.constantFrom('%%%%', 'abc', 'ab=c', '====', 'YQ==YQ==')),
    },
    { requiredKeys: [] },
  ),
  fc
    .tuple(fc.constant({ path: 'fuzz.txt', contentBase64: 'YQ==' }), extraField)
    .map(([p, [k, v]]) => ({ ...p, [k]: v })),
);
/** Updates that take no argument get one or more. */
const noArgs = fc.array(junk, { minLength: 1, maxLength: 3 });

beforeAll(async () => {
  unprintedWorkerLogs.push(/respondSignal rejected/);
  stack = await startStack();
  app = buildApi({ client: stack.client, tokens: [{ name: 'fuzzer', secret: SECRET, role: 'operator' }], logger: false });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  call = httpClient(`http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`);

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
}, 120_000);

afterAll(async () => {
  await app?.close();
  await stack?.stop();
});

interface Refusal {
  code: string;
  message: string;
}

/** Sends an Update exactly as given; its refusal, or undefined when it was accepted. */
async function rawUpdate(workflowId: string, name: string, args: unknown[]): Promise<Refusal | undefined> {
  const [first, ...rest] = args;
  if (args.length === 0) throw new Error('rawUpdate sends at least one argument');
  try {
    await stack.temporal.workflow.getHandle(workflowId).executeUpdate(name, { args: [first, ...rest] });
    return undefined;
  } catch (err) {
    const failure = toStasisError(err, name);
    return { code: failure.code, message: failure.message };
  }
}

/** Counts a payload as a trial, verified when it was refused with one of `codes` and a message. */
function judge(what: string, refusal: Refusal | undefined, codes: string[]): boolean {
  const id = `${what} #${tally.trials}`;
  tally.start(id, `${what}: ${refusal ? `${refusal.code} ${refusal.message}` : 'accepted'}`);
  tally.inject();
  if (!refusal || !codes.includes(refusal.code) || refusal.message.length === 0) return false;
  refusedCodes.set(refusal.code, (refusedCodes.get(refusal.code) ?? 0) + 1);
  tally.ok(id);
  return true;
}

async function fuzzUpdate(
  what: string,
  workflowId: string,
  name: string,
  args: fc.Arbitrary<unknown[]>,
  numRuns: number,
  codes = ['INVALID_ARGUMENT'],
) {
  await fc.assert(
    fc.asyncProperty(args, async (a) =>
      judge(`${what} ${JSON.stringify(a).slice(0, 200)}`, await rawUpdate(workflowId, name, a), codes),
    ),
    { numRuns, endOnFailure: true },
  );
}

/** What must not change: the user view, the operator view, the sandbox view, its files and processes. */
async function observable() {
  const workspace = path.join(stack.config.STASIS_DATA_DIR, 'hosts', 'host-a', 'sandboxes', sandboxId, 'workspace');
  const files = fs.readdirSync(workspace, { recursive: true }).map(String).sort();
  return {
    run: await stack.client.runs.get(runId),
    resource: await stack.client.runs.resource(runId),
    sandbox: await stack.client.sandboxes.get(sandboxId),
    files,
    keep: fs.readFileSync(path.join(workspace, 'keep.txt'), 'utf8'),
    processes: await stack.workers.get('host-a')!.registry.get('local').processCount(sandboxId),
  };
}

const updateEvents = (events: HistoryEvent[]) =>
  events.filter(
    (e) => e.workflowExecutionUpdateAcceptedEventAttributes || e.workflowExecutionUpdateCompletedEventAttributes,
  );
const sandboxWf = () => `sandbox-${sandboxId}`;

test('malformed Updates, signals and REST requests are all refused; nothing changes', async () => {
  const before = await observable();
  const runHistory = await historyEvents(stack.temporal, runId);
  const sandboxHistory = await historyEvents(stack.temporal, sandboxWf());

  // Updates of the Run.
  await fuzzUpdate(
    'respond',
    runId,
    'respond',
    withArity(respondPayload.filter(rejectedBy(RespondInput)), {
      interactionId: 'int-1',
      response: { decision: 'approve' },
    }),
    UPDATE_RUNS.respond,
  );
  await fuzzUpdate('run suspend', runId, 'suspend', noArgs, UPDATE_RUNS.runSuspend);
  await fuzzUpdate('run resume', runId, 'resume', noArgs, UPDATE_RUNS.runResume);
  // Updates of the sandbox.
  for (const change of ['start', 'stop', 'pause', 'resume', 'suspend', 'destroy']) {
    await fuzzUpdate(`sandbox ${change}`, sandboxWf(), change, noArgs, UPDATE_RUNS.sandboxChange);
  }
  await fuzzUpdate(
    'exec',
    sandboxWf(),
    'exec',
    withArity(execPayload.filter(rejectedBy(ExecInput)), { command: 'echo ran > ran.txt' }),
    UPDATE_RUNS.exec,
  );
  await fuzzUpdate(
    'readFile',
    sandboxWf(),
    'readFile',
    withArity(readPayload.filter(rejectedBy(ReadFileInput)), { path: 'keep.txt' }),
    UPDATE_RUNS.readFile,
  );
  await fuzzUpdate(
    'writeFile',
    sandboxWf(),
    'writeFile',
    withArity(writePayload.filter(rejectedBy(WriteFileInput)), { path: 'fuzz.txt', contentBase64: 'YQ==' }),
    UPDATE_RUNS.writeFile,
    ['INVALID_ARGUMENT', 'PAYLOAD_TOO_LARGE'],
  );

  // The signal: fire and forget, so the refusal is the worker's log line (and the unchanged Run).
  const logged = () => workerLogs.filter((e) => e.message === 'respondSignal rejected').length;
  const loggedBefore = logged();
  let signals = 0;
  await fc.assert(
    fc.asyncProperty(respondPayload.filter(rejectedBy(RespondInput)), async (payload) => {
      await stack.temporal.workflow.getHandle(runId).signal('respondSignal', payload);
      signals += 1;
      tally.start(
        `signal ${signals}`,
        `respondSignal ${JSON.stringify(payload).slice(0, 200)}: not logged as rejected`,
      );
      tally.inject();
    }),
    { numRuns: SIGNAL_RUNS },
  );
  await eventually(async () => logged() - loggedBefore >= signals, 30_000, `${signals} rejections logged`);
  for (let i = 1; i <= signals; i++) tally.ok(`signal ${i}`);

  await fuzzRest();

  // Nothing changed, nothing failed, nothing was accepted into either history.
  const after = await observable();
  expect(after).toEqual(before);
  const runAfter = await historyEvents(stack.temporal, runId);
  const sandboxAfter = await historyEvents(stack.temporal, sandboxWf());
  for (const events of [runAfter, sandboxAfter]) expect(failedWorkflowTasks(events)).toEqual([]);
  expect(updateEvents(runAfter)).toEqual(updateEvents(runHistory));
  expect(updateEvents(sandboxAfter)).toEqual(updateEvents(sandboxHistory));
  expect(sandboxAfter.length).toBe(sandboxHistory.length);
  expect(runAfter.filter((e) => e.workflowExecutionSignaledEventAttributes)).toHaveLength(
    signals + runHistory.filter((e) => e.workflowExecutionSignaledEventAttributes).length,
  );

  // Both are still fully usable.
  await expect(stack.client.sandboxes.exec(sandboxId, { command: 'cat keep.txt; echo; ls' })).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'keep me\nkeep.txt\n',
  });
  await stack.client.sandboxes.destroy(sandboxId);
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('done');
}, 600_000);

// ------------------------------------------------------------------ REST

interface RestRequest {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  path: string;
  json?: unknown;
  raw?: { body: string | Buffer; contentType: string };
}

const badId = fc
  .oneof(junkString, fc.string({ unit: 'binary', maxLength: 20 }))
  .filter((id) => id.length > 0 && !Identifier.safeParse(id).success);
const seg = (id: string) => encodeURIComponent(id);
const badQueryValue = fc.oneof(junkString, fc.constantFrom('-1', '0', '1001', '1.5', 'NaN', 'SLEEPING', 'waiting'));
/** A body that a JSON route cannot take: JSON the schema refuses, broken JSON, or another content type. */
const badBody = (schema: z.ZodType, json: fc.Arbitrary<unknown>) =>
  fc.oneof(
    { weight: 6, arbitrary: json.filter(rejectedBy(schema)).map((j) => ({ json: j })) },
    {
      weight: 1,
      arbitrary: fc
        .constantFrom('{', '{"a":', 'nul', '[1,', '{"__proto__":{"x":1}}')
        .map((body) => ({ raw: { body, contentType: 'application/json' } })),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(
          fc.string({ minLength: 1 }),
          fc.constantFrom('text/plain', 'application/x-www-form-urlencoded', 'application/xml'),
        )
        .map(([body, contentType]) => ({ raw: { body, contentType } })),
    },
  );
const NO_BODY = z.object({}).strict().optional();
const nonEmptyJunk = junk.filter((j) => !NO_BODY.safeParse(j).success);

function restCases(): fc.Arbitrary<RestRequest> {
  const run = `/api/v1/runs/${runId}`;
  const box = `/api/v1/sandboxes/${sandboxId}`;
  return fc.oneof(
    badBody(
      RunSpec,
      fc.oneof(
        junk,
        fc.record(
          { agent: junk, sandbox: fc.record({ provider: fc.oneof(fc.constant(''), nonString) }) },
          { requiredKeys: [] },
        ),
      ),
    ).map((b) => ({ method: 'POST' as const, path: '/api/v1/runs', ...b })),
    fc
      .record({ status: badQueryValue, limit: badQueryValue }, { requiredKeys: [] })
      .filter((q) => Object.keys(q).length > 0 && !ListRunsQuery.safeParse(q).success)
      .map((q) => ({
        method: 'GET' as const,
        path: `/api/v1/runs?${new URLSearchParams(q as Record<string, string>).toString()}`,
      })),
    badId.map((id) => ({ method: 'GET' as const, path: `/api/v1/runs/${seg(id)}` })),
    badId.map((id) => ({ method: 'GET' as const, path: `/api/v1/runs/${seg(id)}/resource` })),
    badBody(InteractionResponse, respondPayload).map((b) => ({
      method: 'POST' as const,
      path: `${run}/interactions/int-1`,
      ...b,
    })),
    fc.tuple(badId, fc.boolean()).map(([id, which]) => ({
      method: 'POST' as const,
      path: which ? `/api/v1/runs/${seg(id)}/interactions/int-1` : `${run}/interactions/${seg(id)}`,
      json: { decision: 'approve' },
    })),
    fc
      .tuple(fc.constantFrom('suspend', 'resume', 'cancel'), badBody(NO_BODY, nonEmptyJunk))
      .map(([op, b]) => ({ method: 'POST' as const, path: `${run}/${op}`, ...b })),
    badBody(
      CreateSandboxInput,
      fc.oneof(
        junk,
        fc.record(
          { provider: fc.oneof(fc.constant(''), nonString), policy: junk, env: junk, workspace: junk },
          { requiredKeys: [] },
        ),
      ),
    ).map((b) => ({ method: 'POST' as const, path: '/api/v1/sandboxes', ...b })),
    badId.map((id) => ({ method: 'GET' as const, path: `/api/v1/sandboxes/${seg(id)}` })),
    fc
      .tuple(fc.constantFrom('start', 'stop', 'pause', 'resume', 'suspend'), badBody(NO_BODY, nonEmptyJunk))
      .map(([op, b]) => ({ method: 'POST' as const, path: `${box}/${op}`, ...b })),
    badBody(ExecInput, execPayload).map((b) => ({ method: 'POST' as const, path: `${box}/exec`, ...b })),
    fc
      .oneof(
        badPath.filter((p) => typeof p === 'string' && !WorkspacePath.safeParse(p).success),
        fc.constant(undefined),
      )
      .map((p) => ({
        method: 'GET' as const,
        path: `${box}/files${p === undefined ? '' : `?path=${encodeURIComponent(p as string)}`}`,
      })),
    fc
      .tuple(
        badPath.filter((p) => typeof p === 'string' && !WorkspacePath.safeParse(p).success),
        fc.uint8Array({ maxLength: 64 }),
      )
      .map(([p, bytes]) => ({
        method: 'PUT' as const,
        path: `${box}/files?path=${encodeURIComponent(p as string)}`,
        raw: { body: Buffer.from(bytes), contentType: 'application/octet-stream' },
      })),
    badId.map((id) => ({ method: 'DELETE' as const, path: `/api/v1/sandboxes/${seg(id)}` })),
    badBody(NO_BODY, nonEmptyJunk).map((b) => ({ method: 'DELETE' as const, path: box, ...b })),
  );
}

async function send(request: RestRequest): Promise<HttpResult> {
  return call(request.method, request.path, {
    token: SECRET,
    ...(request.json !== undefined ? { body: request.json } : {}),
    ...(request.raw ? { raw: request.raw.body, contentType: request.raw.contentType } : {}),
  });
}

async function fuzzRest(): Promise<void> {
  await fc.assert(
    fc.asyncProperty(restCases(), async (request) => {
      const response = await send(request);
      const body = response.json as { error?: { code?: unknown; message?: unknown } } | undefined;
      const code = body?.error?.code;
      const message = body?.error?.message;
      const refusal =
        response.status >= 400 &&
        response.status < 500 &&
        isErrorCode(code) &&
        ERROR_STATUS[code] === response.status &&
        typeof message === 'string'
          ? { code, message }
          : undefined;
      // A 400 names the part of the request that is wrong.
      const clear =
        refusal !== undefined &&
        (refusal.code !== 'INVALID_ARGUMENT' || /^(body|params|query)\b/.test(refusal.message));
      return judge(
        `REST ${request.method} ${request.path.slice(0, 120)} → ${response.status}`,
        clear ? refusal : undefined,
        ['INVALID_ARGUMENT', 'NOT_FOUND', 'PAYLOAD_TOO_LARGE'],
      );
    }),
    { numRuns: REST_RUNS, endOnFailure: true },
  );
}

test('URLs the router itself refuses keep the contract: 401 without a token, else 400 {error}; every valid id reaches its route', async () => {
  const cases: [string, number, string][] = [
    ['/api/v1/runs/%E0%A4%A', 400, 'INVALID_ARGUMENT'],
    [`/api/v1/runs/${'r'.repeat(600)}`, 400, 'INVALID_ARGUMENT'],
    // The longest valid id (an Identifier is up to 128 characters) is looked up, not refused by the router.
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

test('summary: every malformed payload refused, nothing changed', () => {
  writeSummary('bad-input', tally, {
    updates: Object.values(UPDATE_RUNS).reduce((a, b) => a + b, 0) + 5 * UPDATE_RUNS.sandboxChange,
    signals: SIGNAL_RUNS,
    rest: REST_RUNS,
    codes: [...refusedCodes].map(([c, n]) => `${c}:${n}`).join(','),
  });
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBeGreaterThanOrEqual(1_000);
});
