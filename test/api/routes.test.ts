import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { StasisClient } from '../../client';
import type { RunSnapshot, SandboxView } from '../../common/schemas';
import { buildApi } from '../../api/server';
import { FILE_LIMIT_BYTES } from '../../common/payload-limits';
import { eventually, startStack, type TestStack } from '../helpers/stack';
import { errorCode, errorMessage, httpClient, type CallOptions, type HttpResult } from './http';
import { noPauseProvider } from './no-pause-provider';
import { StasisBlockedSince, StasisKind, StasisResourceState } from '../../workflows/search-attributes';

// Every REST route against the real worker and dev server, over a real socket.

const ALICE = 'alice-secret-0123456789';
const BOB = 'bob-secret-9876543210';

let stack: TestStack;
let app: FastifyInstance;
let call: (method: string, path: string, options?: CallOptions) => Promise<HttpResult>;
const logLines: string[] = [];
const as =
  (token: string) =>
  (method: string, path: string, options: CallOptions = {}) =>
    call(method, path, { token, ...options });
let alice: ReturnType<typeof as>;
let bob: ReturnType<typeof as>;

beforeAll(async () => {
  stack = await startStack({ worker: { providers: [noPauseProvider] } });
  const logs = new Writable({
    write(chunk: Buffer, _encoding, done) {
      logLines.push(chunk.toString('utf8'));
      done();
    },
  });
  app = buildApi({
    client: stack.client,
    tokens: [
      { name: 'alice', secret: ALICE, role: 'operator' },
      { name: 'bob', secret: BOB, role: 'operator' },
    ],
    logger: { level: 'info', destination: logs },
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  call = httpClient(`http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`);
  alice = as(ALICE);
  bob = as(BOB);
});

afterAll(async () => {
  await app?.close();
  await stack?.stop();
});

const snapshot = (r: HttpResult) => r.json as RunSnapshot;
const sandbox = (r: HttpResult) => r.json as SandboxView;
const runStatus = async (runId: string) => snapshot(await alice('GET', `/api/v1/runs/${runId}`)).status;
const waitFor = (runId: string, status: RunSnapshot['status']) =>
  eventually(async () => (await runStatus(runId)) === status, 60_000, `run ${runId} ${status}`);

/** Every /api route, with placeholder ids (auth runs before anything else). */
const API_ROUTES: [string, string][] = [
  ['POST', '/api/v1/runs'],
  ['GET', '/api/v1/runs?status=WAITING'],
  ['GET', '/api/v1/runs/r1'],
  ['GET', '/api/v1/runs/r1/resource'],
  ['POST', '/api/v1/runs/r1/interactions/int-1'],
  ['POST', '/api/v1/runs/r1/suspend'],
  ['POST', '/api/v1/runs/r1/resume'],
  ['POST', '/api/v1/runs/r1/cancel'],
  ['POST', '/api/v1/runs/r1/actions'],
  ['GET', '/api/v1/runs/r1/actions/a1'],
  ['POST', '/api/v1/sandboxes'],
  ['GET', '/api/v1/sandboxes/s1'],
  ...['start', 'stop', 'pause', 'resume', 'suspend', 'exec'].map((op): [string, string] => [
    'POST',
    `/api/v1/sandboxes/s1/${op}`,
  ]),
  ['GET', '/api/v1/sandboxes/s1/files?path=a.txt'],
  ['PUT', '/api/v1/sandboxes/s1/files?path=a.txt'],
  ['DELETE', '/api/v1/sandboxes/s1'],
  ['GET', '/api/v1/metrics'],
  ['GET', '/api/openapi.json'],
  ['GET', '/api/v1/me'],
];

describe('authentication', () => {
  test.each(API_ROUTES)(
    '%s %s needs a bearer token: 401 without one, with a wrong one, or another scheme',
    async (method, path) => {
      for (const headers of [
        {} as Record<string, string>,
        { authorization: `Bearer ${ALICE}x` },
        { authorization: 'Bearer ' },
        { authorization: `Basic ${ALICE}` },
      ]) {
        const response = await call(method, path, {
          headers,
          ...(method === 'GET' || method === 'DELETE' ? {} : { body: {} }),
        });
        expect(response.status).toBe(401);
        expect(response.json).toEqual({ error: { code: 'UNAUTHORIZED', message: expect.stringContaining('Bearer') } });
      }
    },
  );

  test('an unknown /api route is 401 without a token and 404 with one', async () => {
    expect((await call('GET', '/api/v1/nothing')).status).toBe(401);
    const missing = await alice('GET', '/api/v1/nothing?x=1');
    expect(missing.status).toBe(404);
    expect(missing.json).toEqual({ error: { code: 'NOT_FOUND', message: 'no route GET /api/v1/nothing' } });
  });

  test('the page and /metrics need no token; a miss outside /api is a plain 404', async () => {
    expect((await call('GET', '/')).status).toBe(200);
    expect((await call('GET', '/metrics')).status).toBe(200);
    const miss = await call('GET', '/favicon.ico');
    expect({ status: miss.status, code: errorCode(miss) }).toEqual({ status: 404, code: 'NOT_FOUND' });
  });
});

describe('caching and sniffing', () => {
  test('every answer, errors included, says Cache-Control: no-store and X-Content-Type-Options: nosniff', async () => {
    const { runId } = await stack.client.runs.start({
      agent: { driver: 'scripted', steps: [{ ask: 'Cache me?' }, { complete: 'ok' }] },
      sandbox: { provider: 'local' },
    });
    await waitFor(runId, 'WAITING');
    const answers: Record<string, HttpResult> = {
      'interactions 200': await alice('GET', '/api/v1/interactions'),
      'run 200': await alice('GET', `/api/v1/runs/${runId}`),
      'me 200': await alice('GET', '/api/v1/me'),
      'openapi 200': await alice('GET', '/api/openapi.json'),
      'no token 401': await call('GET', '/api/v1/interactions'),
      'unknown run 404': await alice('GET', '/api/v1/runs/run-never-was'),
      'unknown route 404': await alice('GET', '/api/v1/nothing'),
      'bad body 400': await alice('POST', '/api/v1/runs', { body: { nope: 1 } }),
      'bad query 400': await alice('GET', '/api/v1/runs?status=%ZZ'),
      'bad URL 400 (router)': await alice('GET', '/api/v1/runs/%E0%A4'),
      'body too large 413': await alice('POST', '/api/v1/runs', {
        raw: JSON.stringify({ x: 'x'.repeat(FILE_LIMIT_BYTES) }),
        contentType: 'application/json',
      }),
      'answered twice 409': await (async () => {
        expect(
          (await alice('POST', `/api/v1/runs/${runId}/interactions/int-1`, { body: { decision: 'approve' } })).status,
        ).toBe(200);
        return alice('POST', `/api/v1/runs/${runId}/interactions/int-1`, { body: { decision: 'deny' } });
      })(),
      'page 200': await call('GET', '/'),
      'metrics 200': await call('GET', '/metrics'),
    };
    const seen = Object.fromEntries(
      Object.entries(answers).map(([what, r]) => [
        what,
        [r.status, r.headers.get('cache-control'), r.headers.get('x-content-type-options')],
      ]),
    );
    expect(seen).toEqual(
      Object.fromEntries(
        Object.entries(answers).map(([what]) => [what, [Number(/\d{3}/.exec(what)?.[0]), 'no-store', 'nosniff']]),
      ),
    );
  });
});

describe('OpenAPI', () => {
  test('documents every route from the same zod schemas', async () => {
    const response = await alice('GET', '/api/openapi.json');
    expect(response.status).toBe(200);
    const doc = response.json as {
      openapi: string;
      paths: Record<
        string,
        Record<
          string,
          {
            requestBody?: { content: Record<string, { schema: unknown }> };
            responses: Record<string, unknown>;
            parameters: { name: string; in: string; required: boolean }[];
          }
        >
      >;
      components: { schemas: Record<string, { properties?: Record<string, unknown>; required?: string[] }> };
    };
    expect(doc.openapi).toBe('3.1.0');
    const documented = Object.entries(doc.paths).flatMap(([path, methods]) =>
      Object.keys(methods).map((m) => `${m.toUpperCase()} ${path}`),
    );
    expect(documented.sort()).toEqual(
      [
        'POST /api/v1/runs',
        'GET /api/v1/runs',
        'GET /api/v1/runs/{id}',
        'GET /api/v1/runs/{id}/resource',
        'GET /api/v1/interactions',
        'POST /api/v1/runs/{id}/interactions/{iid}',
        'POST /api/v1/runs/{id}/suspend',
        'POST /api/v1/runs/{id}/resume',
        'POST /api/v1/runs/{id}/cancel',
        'POST /api/v1/runs/{id}/actions',
        'GET /api/v1/runs/{id}/actions/{actionId}',
        'POST /api/v1/sandboxes',
        'GET /api/v1/sandboxes',
        'GET /api/v1/sandboxes/{id}',
        ...['start', 'stop', 'pause', 'resume', 'suspend', 'exec'].map((op) => `POST /api/v1/sandboxes/{id}/${op}`),
        'GET /api/v1/sandboxes/{id}/files',
        'PUT /api/v1/sandboxes/{id}/files',
        'DELETE /api/v1/sandboxes/{id}',
        'GET /api/v1/metrics',
        'GET /metrics',
        'GET /api/openapi.json',
        'GET /api/v1/me',
      ].sort(),
    );
    expect(doc.paths['/api/v1/runs'].post.requestBody?.content['application/json'].schema).toEqual({
      $ref: '#/components/schemas/RunSpec',
    });
    expect(doc.components.schemas.RunSpec.required).toEqual(['agent', 'sandbox']);
    expect(Object.keys(doc.components.schemas.SandboxView.properties ?? {})).toEqual(
      expect.arrayContaining(['sandboxId', 'state']),
    );
    expect(doc.paths['/api/v1/sandboxes/{id}/files'].put.parameters).toEqual(
      expect.arrayContaining([expect.objectContaining({ name: 'path', in: 'query', required: true })]),
    );
    expect(Object.keys(doc.paths['/api/v1/sandboxes/{id}/suspend'].post.responses)).toEqual(
      expect.arrayContaining(['200', '401', '404', '409', '501']),
    );
    // An action answers 200 when it finished within the wait, 202 while it is still under way.
    const act = doc.paths['/api/v1/runs/{id}/actions'].post;
    expect(act.requestBody?.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/ActionRequest' });
    expect(Object.keys(act.responses)).toEqual(expect.arrayContaining(['200', '202', '400', '403', '404', '409']));
    expect(act.parameters).toEqual(
      expect.arrayContaining([expect.objectContaining({ name: 'waitMs', in: 'query', required: false })]),
    );
    expect(doc.components.schemas.ActionRequest.required).toEqual(['actionId', 'action']);
  });
});

describe('runs', () => {
  const twoQuestions = {
    agent: {
      driver: 'scripted',
      steps: [{ ask: 'Ship it?' }, { ask: 'Which branch?', kind: 'input' }, { complete: { shipped: true } }],
    },
    sandbox: { provider: 'local' },
  };

  test('start, wait, answer (recording the token name), refuse a second answer, complete', async () => {
    const started = await alice('POST', '/api/v1/runs', { body: twoQuestions });
    expect(started.status).toBe(201);
    const { runId } = started.json as { runId: string };
    expect(runId).toMatch(/^run-/);
    await waitFor(runId, 'WAITING');

    const waiting = await alice('GET', '/api/v1/runs?status=WAITING');
    expect(waiting.status).toBe(200);
    expect((waiting.json as { runs: RunSnapshot[] }).runs.map((r) => r.runId)).toContain(runId);
    const view = snapshot(await alice('GET', `/api/v1/runs/${runId}`));
    expect(view.interactions).toEqual([
      expect.objectContaining({ id: 'int-1', kind: 'approval', prompt: 'Ship it?', status: 'pending' }),
    ]);
    expect(view).not.toHaveProperty('record');

    const duplicate = await alice('POST', '/api/v1/runs', { body: { ...twoQuestions, runId } });
    expect({ status: duplicate.status, code: errorCode(duplicate) }).toEqual({ status: 409, code: 'ALREADY_EXISTS' });

    const resource = await alice('GET', `/api/v1/runs/${runId}/resource`);
    expect(resource.status).toBe(200);
    expect(resource.json).toMatchObject({
      runId,
      record: { provider: 'local' },
      suspension: { reason: 'INTERACTION', interactionIds: ['int-1'] },
    });

    const answered = await alice('POST', `/api/v1/runs/${runId}/interactions/int-1`, {
      body: { decision: 'approve', comment: 'lgtm' },
    });
    expect(answered.status).toBe(200);
    expect(answered.json).toMatchObject({
      id: 'int-1',
      status: 'answered',
      respondedBy: 'alice',
      response: { decision: 'approve', comment: 'lgtm' },
    });

    const late = await bob('POST', `/api/v1/runs/${runId}/interactions/int-1`, { body: { decision: 'deny' } });
    expect(late.status).toBe(409);
    expect(errorCode(late)).toBe('ALREADY_ANSWERED');

    const unknown = await bob('POST', `/api/v1/runs/${runId}/interactions/int-9`, { body: { decision: 'deny' } });
    expect(unknown.status).toBe(404);
    expect(errorCode(unknown)).toBe('NOT_FOUND');

    await eventually(
      async () => snapshot(await alice('GET', `/api/v1/runs/${runId}`)).interactions.length === 2,
      60_000,
      'second question',
    );
    const input = await bob('POST', `/api/v1/runs/${runId}/interactions/int-2`, { body: { input: 'main' } });
    expect(input.status).toBe(200);
    expect(input.json).toMatchObject({ id: 'int-2', respondedBy: 'bob', response: { input: 'main' } });
    await waitFor(runId, 'COMPLETED');
    expect(snapshot(await alice('GET', `/api/v1/runs/${runId}`)).output).toEqual({ shipped: true });

    const closed = await alice('POST', `/api/v1/runs/${runId}/interactions/int-2`, { body: { input: 'again' } });
    expect(closed.status).toBe(409);
    expect(errorCode(closed)).toBe('INVALID_STATE_TRANSITION');
  });

  test.each([
    ['no sandbox', { agent: { driver: 'scripted', steps: [{ complete: 1 }] } }, 'body.sandbox'],
    ['scripted without steps', { agent: { driver: 'scripted' }, sandbox: { provider: 'local' } }, 'body.agent'],
    ['an unknown field', { ...twoQuestions, colour: 'red' }, 'colour'],
    ['a bad runId', { ...twoQuestions, runId: '../etc' }, 'body.runId'],
    ['a bad duration', { ...twoQuestions, policy: { ttl: 'soon' } }, 'body.policy.ttl'],
    ['an array', [twoQuestions], 'body'],
    [
      'a NUL byte in an exec step',
      { agent: { driver: 'scripted', steps: [{ exec: 'rm -rf x\0y' }] }, sandbox: { provider: 'local' } },
      'body.agent',
    ],
    [
      'a NUL byte in the sandbox env',
      { ...twoQuestions, sandbox: { provider: 'local', env: { A: 'x\0' } } },
      'body.sandbox.env.A: must not contain a NUL byte',
    ],
  ])('POST /api/v1/runs with %s is 400 naming the field', async (_kind, body, field) => {
    const response = await alice('POST', '/api/v1/runs', { body });
    expect(response.status).toBe(400);
    expect(errorCode(response)).toBe('INVALID_ARGUMENT');
    expect(errorMessage(response)).toContain(field);
  });

  test('malformed JSON, a wrong content type and an empty body are 400; an oversized body is 413', async () => {
    for (const [raw, contentType] of [
      ['{"agent":', 'application/json'],
      ['agent=1', 'text/plain'],
      ['', 'application/json'],
      ['\ufeff{}', 'application/json'],
    ]) {
      const response = await alice('POST', '/api/v1/runs', { raw, contentType });
      expect({ status: response.status, code: errorCode(response) }).toEqual({ status: 400, code: 'INVALID_ARGUMENT' });
      expect(errorMessage(response)).toMatch(/^body/);
    }
    const huge = await alice('POST', '/api/v1/runs', {
      body: { ...twoQuestions, labels: { big: 'x'.repeat(1024 * 1024) } },
    });
    expect(huge.status).toBe(413);
    expect(errorCode(huge)).toBe('PAYLOAD_TOO_LARGE');
  });

  test.each([
    ['an empty body', {}, 'body'],
    ['an unknown decision', { decision: 'maybe' }, 'body.decision'],
    ['an extra field', { decision: 'approve', by: 'me' }, 'by'],
    ['a non-string input', { input: 5 }, 'body.input'],
  ])('answering with %s is 400 naming the field', async (_kind, body, field) => {
    const response = await alice('POST', '/api/v1/runs/run-x/interactions/int-1', { body });
    expect(response.status).toBe(400);
    expect(errorCode(response)).toBe('INVALID_ARGUMENT');
    expect(errorMessage(response)).toContain(field);
  });

  test('bad ids, statuses and limits are 400; unknown runs are 404', async () => {
    const cases: [string, string, string][] = [
      ['GET', '/api/v1/runs?status=SLEEPING', 'query.status'],
      ['GET', '/api/v1/runs?limit=0', 'query.limit'],
      ['GET', '/api/v1/runs/bad%20id', 'params.id'],
      ['POST', '/api/v1/runs/run-x/interactions/bad%20id', 'params.iid'],
    ];
    for (const [method, path, field] of cases) {
      const response = await alice(method, path, method === 'POST' ? { body: { decision: 'approve' } } : {});
      expect({ path, status: response.status, code: errorCode(response) }).toEqual({
        path,
        status: 400,
        code: 'INVALID_ARGUMENT',
      });
      expect(errorMessage(response)).toContain(field);
    }
    for (const [method, path] of [
      ['GET', '/api/v1/runs/run-missing'],
      ['GET', '/api/v1/runs/run-missing/resource'],
      ['POST', '/api/v1/runs/run-missing/interactions/int-1'],
      ['POST', '/api/v1/runs/run-missing/suspend'],
      ['POST', '/api/v1/runs/run-missing/resume'],
      ['POST', '/api/v1/runs/run-missing/cancel'],
    ]) {
      const response = await alice(
        method,
        path,
        path.includes('interactions') ? { body: { decision: 'approve' } } : {},
      );
      expect({ path, status: response.status, code: errorCode(response) }).toEqual({
        path,
        status: 404,
        code: 'NOT_FOUND',
      });
    }
  });

  test('suspend and resume by hand; each refused (409) when the Run is not in the right phase', async () => {
    const { runId } = (
      await alice('POST', '/api/v1/runs', {
        body: {
          agent: { driver: 'scripted', steps: [{ exec: 'sleep 2' }, { exec: 'echo after' }] },
          sandbox: { provider: 'local' },
        },
      })
    ).json as { runId: string };
    const early = await alice('POST', `/api/v1/runs/${runId}/resume`);
    expect({ status: early.status, code: errorCode(early) }).toEqual({ status: 409, code: 'INVALID_STATE_TRANSITION' });

    const stray = await alice('POST', `/api/v1/runs/${runId}/suspend`, { body: { now: true } });
    expect({ status: stray.status, code: errorCode(stray) }).toEqual({ status: 400, code: 'INVALID_ARGUMENT' });

    const suspended = await alice('POST', `/api/v1/runs/${runId}/suspend`, {
      raw: '',
      contentType: 'application/json',
    });
    expect(suspended.status).toBe(200);
    expect(snapshot(suspended).status).toBe('RUNNING');
    const resource = (await alice('GET', `/api/v1/runs/${runId}/resource`)).json as {
      phase: string;
      suspension?: { reason: string };
    };
    expect(resource).toMatchObject({ phase: 'SUSPENDED', suspension: { reason: 'MANUAL' } });
    const again = await alice('POST', `/api/v1/runs/${runId}/suspend`);
    expect({ status: again.status, code: errorCode(again) }).toEqual({ status: 409, code: 'INVALID_STATE_TRANSITION' });

    const resumed = await alice('POST', `/api/v1/runs/${runId}/resume`);
    expect(resumed.status).toBe(200);
    await waitFor(runId, 'COMPLETED');
    expect(snapshot(await alice('GET', `/api/v1/runs/${runId}`)).output).toMatchObject({ stdout: 'after\n' });
    await stack.temporal.workflow.getHandle(runId).result();
    const cancelDone = await alice('POST', `/api/v1/runs/${runId}/cancel`);
    expect({ status: cancelDone.status, code: errorCode(cancelDone) }).toEqual({
      status: 409,
      code: 'INVALID_STATE_TRANSITION',
    });
  });

  test('cancel a waiting Run, then 409 for a second cancel', async () => {
    const { runId } = (await alice('POST', '/api/v1/runs', { body: twoQuestions })).json as { runId: string };
    await waitFor(runId, 'WAITING');
    // A body with a byte order mark is not JSON text: refused, and the Run is not cancelled.
    const marked = await alice('POST', `/api/v1/runs/${runId}/cancel`, {
      raw: '\ufeff{}',
      contentType: 'application/json',
    });
    expect({ status: marked.status, code: errorCode(marked) }).toEqual({ status: 400, code: 'INVALID_ARGUMENT' });
    expect(snapshot(await alice('GET', `/api/v1/runs/${runId}`)).status).toBe('WAITING');
    const cancelled = await alice('POST', `/api/v1/runs/${runId}/cancel`);
    expect(cancelled.status).toBe(200);
    await waitFor(runId, 'CANCELLED');
    expect(snapshot(await alice('GET', `/api/v1/runs/${runId}`)).interactions[0].status).toBe('cancelled');
    // Once the workflow has closed (its compute released), there is nothing left to cancel.
    await stack.temporal.workflow
      .getHandle(runId)
      .result()
      .catch(() => undefined);
    const again = await alice('POST', `/api/v1/runs/${runId}/cancel`);
    expect({ status: again.status, code: errorCode(again) }).toEqual({ status: 409, code: 'INVALID_STATE_TRANSITION' });
  });

  test('answering a Run suspended past its retention is 409 STALE_SANDBOX_ROUTE', async () => {
    const { runId } = (
      await alice('POST', '/api/v1/runs', { body: { ...twoQuestions, policy: { suspendedRetentionSeconds: 2 } } })
    ).json as { runId: string };
    await waitFor(runId, 'EXPIRED');
    const late = await alice('POST', `/api/v1/runs/${runId}/interactions/int-1`, { body: { decision: 'approve' } });
    expect({ status: late.status, code: errorCode(late) }).toEqual({ status: 409, code: 'STALE_SANDBOX_ROUTE' });
  });
});

describe('sandboxes', () => {
  const create = async (body: unknown = { provider: 'local' }): Promise<SandboxView> => {
    const response = await alice('POST', '/api/v1/sandboxes', { body });
    expect(response.status).toBe(201);
    return sandbox(response);
  };
  const op = (id: string, name: string) => alice('POST', `/api/v1/sandboxes/${id}/${name}`);
  const exec = (id: string, body: unknown) => alice('POST', `/api/v1/sandboxes/${id}/exec`, { body });
  const expectState = async (response: Promise<HttpResult>, state: string) => {
    const result = await response;
    expect({
      status: result.status,
      state: sandbox(result).state,
      error: result.status === 200 ? undefined : result.json,
    }).toEqual({
      status: 200,
      state,
      error: undefined,
    });
  };
  const expectRefused = async (response: Promise<HttpResult>, status: number, code: string) => {
    const result = await response;
    expect({ status: result.status, code: errorCode(result) }).toEqual({ status, code });
  };

  test('the whole lifecycle: create, start, exec, files, pause, stop, suspend, resume, destroy', async () => {
    const created = await create({ provider: 'local', env: { GREETING: 'hi' } });
    expect(created).toMatchObject({ sandboxId: expect.stringMatching(/^sbx-/), state: 'created', provider: 'local' });
    const id = created.sandboxId;
    expect(sandbox(await alice('GET', `/api/v1/sandboxes/${id}`)).state).toBe('created');
    await expectRefused(exec(id, { command: 'true' }), 409, 'INVALID_STATE_TRANSITION');
    await expectRefused(op(id, 'suspend'), 409, 'INVALID_STATE_TRANSITION');

    await expectState(op(id, 'start'), 'running');
    const ran = await exec(id, { command: 'echo "$GREETING $EXTRA"; echo oops >&2; exit 3', env: { EXTRA: 'there' } });
    expect(ran.status).toBe(200);
    expect(ran.json).toEqual({ exitCode: 3, stdout: 'hi there\n', stderr: 'oops\n' });

    const bytes = Buffer.from([0, 1, 2, 255, 254, 10, 13]);
    const put = await alice('PUT', `/api/v1/sandboxes/${id}/files?path=${encodeURIComponent('notes/raw.bin')}`, {
      raw: bytes,
    });
    expect(put.status).toBe(204);
    const got = await alice('GET', `/api/v1/sandboxes/${id}/files?path=notes/raw.bin`);
    expect(got.status).toBe(200);
    expect(got.headers.get('content-type')).toBe('application/octet-stream');
    expect(got.bytes.equals(bytes)).toBe(true);
    const text = await alice('PUT', `/api/v1/sandboxes/${id}/files?path=hello.json`, {
      raw: '{"a":1}',
      contentType: 'application/json',
    });
    expect(text.status).toBe(204);
    expect((await exec(id, { command: 'cat hello.json' })).json).toMatchObject({ stdout: '{"a":1}' });
    // File content is bytes whatever its type says: not UTF-8 under application/json is kept as sent.
    const notText = Buffer.from([0x7b, 0xff, 0xfe, 0x80, 0x7d]);
    const putNotText = await alice('PUT', `/api/v1/sandboxes/${id}/files?path=bytes.json`, {
      raw: notText,
      contentType: 'application/json',
    });
    expect(putNotText.status).toBe(204);
    expect((await alice('GET', `/api/v1/sandboxes/${id}/files?path=bytes.json`)).bytes.equals(notText)).toBe(true);
    await expectRefused(alice('GET', `/api/v1/sandboxes/${id}/files?path=missing.txt`), 404, 'NOT_FOUND');

    await expectState(op(id, 'pause'), 'paused');
    await expectRefused(op(id, 'pause'), 409, 'INVALID_STATE_TRANSITION');
    await expectRefused(exec(id, { command: 'true' }), 409, 'INVALID_STATE_TRANSITION');
    await expectState(op(id, 'resume'), 'running');

    await expectState(op(id, 'stop'), 'stopped');
    await expectRefused(op(id, 'suspend'), 409, 'INVALID_STATE_TRANSITION');
    expect(errorMessage(await op(id, 'pause'))).toBe('sandbox: invalid state transition');
    await expectState(op(id, 'start'), 'running');

    await expectState(op(id, 'suspend'), 'suspended');
    await expectState(op(id, 'suspend'), 'suspended');
    await expectRefused(exec(id, { command: 'true' }), 409, 'INVALID_STATE_TRANSITION');
    await expectRefused(alice('GET', `/api/v1/sandboxes/${id}/files?path=hello.json`), 409, 'INVALID_STATE_TRANSITION');
    await expectState(op(id, 'resume'), 'running');
    await expectState(op(id, 'resume'), 'running');
    expect((await exec(id, { command: 'cat hello.json' })).json).toMatchObject({ exitCode: 0, stdout: '{"a":1}' });

    await expectState(alice('DELETE', `/api/v1/sandboxes/${id}`), 'destroyed');
    await expectRefused(alice('GET', `/api/v1/sandboxes/${id}`), 404, 'NOT_FOUND');
    await expectRefused(alice('DELETE', `/api/v1/sandboxes/${id}`), 404, 'NOT_FOUND');
    await expectRefused(op(id, 'start'), 404, 'NOT_FOUND');
    await expectRefused(exec(id, { command: 'true' }), 404, 'NOT_FOUND');
  });

  test('suspend while a command runs is 409 SANDBOX_SUSPEND_BUSY', async () => {
    const { sandboxId } = await create();
    await expectState(op(sandboxId, 'start'), 'running');
    const provider = stack.workers.get('host-a')!.registry.get('local');
    const idle = await provider.processCount(sandboxId);
    const running = exec(sandboxId, { command: 'sleep 3; echo done' });
    await eventually(async () => (await provider.processCount(sandboxId)) > idle, 20_000, 'the command to start');
    await expectRefused(op(sandboxId, 'suspend'), 409, 'SANDBOX_SUSPEND_BUSY');
    expect((await running).json).toMatchObject({ exitCode: 0, stdout: 'done\n' });
    await expectState(op(sandboxId, 'suspend'), 'suspended');
    await expectState(alice('DELETE', `/api/v1/sandboxes/${sandboxId}`), 'destroyed');
  });

  test('a provider without pause or a release mode answers 501 NOT_SUPPORTED', async () => {
    const { sandboxId } = await create({ provider: 'nopause' });
    await expectState(op(sandboxId, 'start'), 'running');
    await expectRefused(op(sandboxId, 'pause'), 501, 'NOT_SUPPORTED');
    await expectRefused(op(sandboxId, 'suspend'), 501, 'NOT_SUPPORTED');
    await expectState(alice('GET', `/api/v1/sandboxes/${sandboxId}`), 'running');
    await expectState(alice('DELETE', `/api/v1/sandboxes/${sandboxId}`), 'destroyed');
  });

  test('a sandbox suspended past retention answers 409 STALE_SANDBOX_ROUTE', async () => {
    // Retention is fixed at creation from the creating process's setting: 2 s here.
    const shortLived = new StasisClient(stack.temporal, {
      taskQueue: stack.config.STASIS_TASK_QUEUE,
      suspendedRetentionSeconds: 2,
    });
    const { sandboxId } = await shortLived.sandboxes.create({ provider: 'local' });
    await shortLived.sandboxes.start(sandboxId);
    await shortLived.sandboxes.suspend(sandboxId);
    await eventually(
      async () => sandbox(await alice('GET', `/api/v1/sandboxes/${sandboxId}`)).error?.code === 'SUSPEND_EXPIRED',
      30_000,
      'expiry',
    );
    await expectRefused(op(sandboxId, 'resume'), 409, 'STALE_SANDBOX_ROUTE');
    await expectRefused(exec(sandboxId, { command: 'true' }), 409, 'STALE_SANDBOX_ROUTE');
    await expectState(alice('DELETE', `/api/v1/sandboxes/${sandboxId}`), 'destroyed');
  });

  test.each([
    ['no provider', {}, 'body.provider'],
    ['a bad env name', { provider: 'local', env: { 'NOT-OK': '1' } }, 'body.env'],
    ['a NUL byte in an env value', { provider: 'local', env: { A: '\0' } }, 'body.env.A: must not contain a NUL byte'],
    ['a NUL byte in an env name', { provider: 'local', env: { 'A\0': '1' } }, 'body.env'],
    ['a bad timeout', { provider: 'local', policy: { timeout: 'forever' } }, 'body.policy.timeout'],
    [
      'a relative active workspace',
      { provider: 'local', workspace: { kind: 'active', hostPath: 'tmp' } },
      'body.workspace.hostPath',
    ],
    ['an unknown field', { provider: 'local', size: 'xl' }, 'size'],
  ])('POST /api/v1/sandboxes with %s is 400 naming the field', async (_kind, body, field) => {
    const response = await alice('POST', '/api/v1/sandboxes', { body });
    expect({ status: response.status, code: errorCode(response) }).toEqual({ status: 400, code: 'INVALID_ARGUMENT' });
    expect(errorMessage(response)).toContain(field);
  });

  test.each([
    ['no command', {}, 'body.command'],
    ['an empty command', { command: '' }, 'body.command'],
    ['a negative timeout', { command: 'true', timeoutMs: -1 }, 'body.timeoutMs'],
    ['a bad env name', { command: 'true', env: { '1X': 'y' } }, 'body.env'],
    ['a NUL byte in the command', { command: 'echo a\0b' }, 'body.command: must not contain a NUL byte'],
    ['a NUL byte in an env value', { command: 'true', env: { X: 'a\0' } }, 'body.env.X: must not contain a NUL byte'],
  ])('exec with %s is 400 naming the field', async (_kind, body, field) => {
    const response = await exec('sbx-any', body);
    expect({ status: response.status, code: errorCode(response) }).toEqual({ status: 400, code: 'INVALID_ARGUMENT' });
    expect(errorMessage(response)).toContain(field);
  });

  test('file paths are validated (400) and file bodies limited (413); unknown sandboxes are 404', async () => {
    for (const path of ['', '?path=', '?path=../escape', '?path=%2Fetc%2Fpasswd']) {
      const response = await alice('GET', `/api/v1/sandboxes/sbx-any/files${path}`);
      expect({ path, status: response.status, code: errorCode(response) }).toEqual({
        path,
        status: 400,
        code: 'INVALID_ARGUMENT',
      });
      expect(errorMessage(response)).toContain('query.path');
    }
    const tooBig = await alice('PUT', '/api/v1/sandboxes/sbx-any/files?path=big.bin', {
      raw: Buffer.alloc(FILE_LIMIT_BYTES + 1),
    });
    expect({ status: tooBig.status, code: errorCode(tooBig) }).toEqual({ status: 413, code: 'PAYLOAD_TOO_LARGE' });
    for (const [method, path] of [
      ['GET', '/api/v1/sandboxes/sbx-missing'],
      ['POST', '/api/v1/sandboxes/sbx-missing/start'],
      ['POST', '/api/v1/sandboxes/sbx-missing/suspend'],
      ['GET', '/api/v1/sandboxes/sbx-missing/files?path=a.txt'],
      ['DELETE', '/api/v1/sandboxes/sbx-missing'],
    ]) {
      const response = await alice(method, path);
      expect({ path, status: response.status, code: errorCode(response) }).toEqual({
        path,
        status: 404,
        code: 'NOT_FOUND',
      });
    }
    const missingExec = await exec('sbx-missing', { command: 'true' });
    expect({ status: missingExec.status, code: errorCode(missingExec) }).toEqual({ status: 404, code: 'NOT_FOUND' });
  });
});

describe('metrics', () => {
  test('one RELEASE_BLOCKED and one RETAINED Run show in the snapshot, with a blocked age that grows, and in Prometheus text', async () => {
    const blocked = await alice('POST', '/api/v1/runs', {
      body: {
        agent: {
          driver: 'scripted',
          steps: [{ exec: 'sleep 120', background: true, pauseBehavior: 'CONTINUE' }, { ask: 'blocked?' }],
        },
        sandbox: { provider: 'local' },
      },
    });
    const retained = await alice('POST', '/api/v1/runs', {
      body: { agent: { driver: 'scripted', steps: [{ ask: 'retained?' }] }, sandbox: { provider: 'nopause' } },
    });
    const ids = [blocked, retained].map((r) => (r.json as { runId: string }).runId);
    // Another deployment's Run in the namespace (its own task queue), blocked for an hour: not ours to count.
    const theirs = await stack.temporal.workflow.start('runWorkflow', {
      taskQueue: `other-deployment-${Date.now()}`,
      workflowId: `other-blocked-${Date.now()}`,
      args: [],
      // No worker polls its queue: it ends by itself should the test stop before it terminates it.
      workflowExecutionTimeout: '2 minutes',
      typedSearchAttributes: [
        { key: StasisKind, value: 'run' },
        { key: StasisResourceState, value: 'RELEASE_BLOCKED' },
        { key: StasisBlockedSince, value: new Date(Date.now() - 3_600_000) },
      ],
    });
    const state = async (runId: string) =>
      ((await alice('GET', `/api/v1/runs/${runId}/resource`)).json as { record: { state: string } }).record.state;
    await eventually(async () => (await state(ids[0])) === 'RELEASE_BLOCKED', 60_000, 'RELEASE_BLOCKED');
    // Our Run was blocked by now, so the oldest blocked age is at least the time since.
    const blockedBy = Date.now();
    await eventually(async () => (await state(ids[1])) === 'RETAINED', 60_000, 'RETAINED');

    type Metrics = { releaseBlocked: number; retained: number; oldestBlockedAgeSeconds: number };
    // Visibility (which the counts come from) trails the workflows by a moment.
    await eventually(
      async () => {
        const m = (await alice('GET', '/api/v1/metrics')).json as Metrics;
        return m.releaseBlocked >= 1 && m.retained >= 1 && m;
      },
      30_000,
      'metrics to count them',
    );
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    const second = (await alice('GET', '/api/v1/metrics')).json as Metrics;
    expect(second.releaseBlocked).toBeGreaterThanOrEqual(1);
    expect(second.retained).toBeGreaterThanOrEqual(1);
    // Other test files' blocked Runs share the server and may end in between, so the
    // oldest can move; it can never be younger than ours, which has waited 2.5 s more.
    expect(second.oldestBlockedAgeSeconds).toBeGreaterThanOrEqual(Math.floor((Date.now() - blockedBy) / 1000));
    expect(second.oldestBlockedAgeSeconds).toBeGreaterThanOrEqual(2);
    // The other deployment's hour-old blocked Run is not counted (it was, before lists kept to their queue).
    expect(second.oldestBlockedAgeSeconds).toBeLessThan(3_000);
    await theirs.terminate();

    const metrics = await call('GET', '/metrics');
    expect(metrics.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const text = metrics.bytes.toString('utf8');
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
    expect(value('stasis_release_blocked')).toBeGreaterThanOrEqual(1);
    expect(value('stasis_retained')).toBeGreaterThanOrEqual(1);
    expect(value('stasis_oldest_blocked_age_seconds')).toBeGreaterThanOrEqual(second.oldestBlockedAgeSeconds);
    for (const name of [
      'stasis_active',
      'stasis_pending_cleanup',
      'stasis_provider_failures_total',
      'stasis_provider_retries_total',
      'stasis_release_latency_p95_ms',
    ]) {
      expect(text).toMatch(new RegExp(`^# TYPE ${name} (gauge|counter)$`, 'm'));
      expect(Number.isFinite(value(name))).toBe(true);
    }
    for (const runId of ids) expect((await alice('POST', `/api/v1/runs/${runId}/cancel`)).status).toBe(200);
  });
});

describe('logging', () => {
  test('requests are logged, tokens never: neither the header nor a ?token= sign-in link, however its name is spelled', async () => {
    await call('GET', `/?token=${ALICE}`);
    // The page reads the link with URLSearchParams, so a percent-encoded name signs in too.
    for (const spelled of ['%74oken', 'tok%65n', '%74%6F%6B%65%6E']) await call('GET', `/?x=1&${spelled}=${BOB}`);
    await alice('GET', '/api/v1/metrics');
    const logs = logLines.join('');
    expect(logs).toContain('/api/v1/metrics');
    expect(logs).toContain('/?token=[redacted]');
    expect(logs).not.toContain(ALICE);
    expect(logs).not.toContain(BOB);
  });
});
