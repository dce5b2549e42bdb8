import * as path from 'node:path';
import { Writable } from 'node:stream';
import { Client, Connection } from '@temporalio/client';
import type { FastifyInstance } from 'fastify';
import { buildApi } from '../../api/server';
import { apiRoutes } from '../../api/routes';
import type { RouteDef } from '../../api/route';
import { StasisClient } from '../../client';
import { httpClient, listenOnLoopback, type CallOptions, type HttpResult } from '../api/http';
import { startStack, workerLogs, type TestStack } from '../helpers/stack';
import { historyEvents, startWaitingRun, Tally, writeSummary } from './helpers';

// Area 6, security: no /api route answers without a valid token (the route
// table itself is iterated, with ids of a real waiting Run and a real running
// sandbox and bodies that would succeed with a token); secrets never reach the
// API's log (at trace level) nor the worker's, nor the Temporal history of Runs
// answered through the API; and under bwrap a sandbox's commands can neither
// read nor write another sandbox's workspace, nor see the worker's credentials.

const ALICE = 'alice-s3cr3t-Tok3n-0123456789';
const BOB = 'bob-s3cr3t-Tok3n-9876543210';
/** Presented by attackers; must not show up anywhere either. */
const FORGED = 'forged-s3cr3t-Tok3n-5555555555';
const SECRETS = [ALICE, BOB, FORGED];

let stack: TestStack;
let app: FastifyInstance;
let call: (method: string, path: string, options?: CallOptions) => Promise<HttpResult>;
const apiLog: string[] = [];
const tally = new Tally();

beforeAll(async () => {
  stack = await startStack();
  app = buildApi({
    client: stack.client,
    tokens: [
      { name: 'alice', secret: ALICE, role: 'operator' },
      { name: 'bob', secret: BOB, role: 'operator' },
    ],
    logger: { level: 'trace', destination: logSink(apiLog) },
  });
  call = await listenOnLoopback(app);
});
afterAll(async () => {
  await app?.close();
  await stack?.stop();
});

function logSink(lines: string[]): Writable {
  return new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(chunk.toString('utf8'));
      done();
    },
  });
}

const waitingRun = (): Promise<string> => startWaitingRun(stack.client);

/** Every way of presenting no valid token. */
const BAD_AUTH: { name: string; headers: Record<string, string>; query?: string }[] = [
  { name: 'no header', headers: {} },
  { name: 'a forged secret', headers: { authorization: `Bearer ${FORGED}` } },
  { name: 'a secret with a character more', headers: { authorization: `Bearer ${ALICE}x` } },
  { name: 'a prefix of a secret', headers: { authorization: `Bearer ${ALICE.slice(0, -1)}` } },
  { name: 'a secret in another case', headers: { authorization: `Bearer ${ALICE.toUpperCase()}` } },
  { name: 'the token name instead of its secret', headers: { authorization: 'Bearer alice' } },
  { name: 'an empty bearer', headers: { authorization: 'Bearer ' } },
  {
    name: 'Basic credentials',
    headers: { authorization: `Basic ${Buffer.from(`alice:${ALICE}`).toString('base64')}` },
  },
  { name: 'the secret without a scheme', headers: { authorization: ALICE } },
  { name: 'the secret as a ?token= link (only the page signs in that way)', headers: {}, query: `token=${ALICE}` },
  { name: 'the secret in another header', headers: { 'x-api-key': ALICE, cookie: `token=${ALICE}` } },
];

test('no /api route of the route table answers without a valid token; nothing happens', async () => {
  const runId = await waitingRun();
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  const runsBefore = (await stack.client.runs.list()).length;

  const table: RouteDef[] = apiRoutes();
  const protectedRoutes = table.filter((r) => !r.public);
  expect(protectedRoutes.length).toBeGreaterThanOrEqual(17);
  // Bodies that would succeed with a token: only the token stands between the caller and the effect.
  const bodyOf = (route: RouteDef): Pick<CallOptions, 'body' | 'raw'> => {
    if (route.method === 'POST' && route.path === '/api/v1/runs')
      return { body: { agent: { driver: 'scripted', steps: [{ complete: 1 }] }, sandbox: { provider: 'local' } } };
    if (route.path.endsWith('/interactions/{iid}')) return { body: { decision: 'approve' } };
    if (route.method === 'POST' && route.path === '/api/v1/sandboxes') return { body: { provider: 'local' } };
    if (route.path.endsWith('/exec')) return { body: { command: 'touch pwned' } };
    if (route.body === 'bytes') return { raw: Buffer.from('pwned') };
    return {};
  };
  const urlOf = (route: RouteDef, query?: string) => {
    const base = route.path
      .replace('/runs/{id}', `/runs/${runId}`)
      .replace('/sandboxes/{id}', `/sandboxes/${sandboxId}`)
      .replace('{iid}', 'int-1');
    const params = [route.path.endsWith('/files') ? 'path=pwned.txt' : undefined, query].filter(Boolean).join('&');
    return params ? `${base}?${params}` : base;
  };
  const targets = [
    ...protectedRoutes.map((route) => ({
      method: route.method,
      url: (q?: string) => urlOf(route, q),
      options: bodyOf(route),
    })),
    { method: 'GET' as const, url: (q?: string) => `/api/openapi.json${q ? `?${q}` : ''}`, options: {} },
    { method: 'GET' as const, url: (q?: string) => `/api/v1/no-such-route${q ? `?${q}` : ''}`, options: {} },
  ];
  for (const target of targets) {
    for (const auth of BAD_AUTH) {
      const id = `${target.method} ${target.url()} with ${auth.name}`;
      tally.start(id, `${id}: answered`);
      tally.inject();
      const response = await call(target.method, target.url(auth.query), { headers: auth.headers, ...target.options });
      expect({ id, status: response.status, json: response.json }).toEqual({
        id,
        status: 401,
        json: { error: { code: 'UNAUTHORIZED', message: expect.stringContaining('Bearer') } },
      });
      tally.ok(id);
    }
  }
  // Nothing happened: the Run still waits, the sandbox runs untouched, no Run or file was made.
  expect((await stack.client.runs.get(runId)).interactions[0].status).toBe('pending');
  expect((await stack.client.sandboxes.get(sandboxId)).state).toBe('running');
  await expect(stack.client.sandboxes.readFile(sandboxId, 'pwned.txt')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  await expect(stack.client.sandboxes.exec(sandboxId, { command: 'ls' })).resolves.toMatchObject({ stdout: '' });
  expect((await stack.client.runs.list()).length).toBe(runsBefore);
  // The control: the same request with a token does answer.
  expect((await call('GET', `/api/v1/runs/${runId}`, { token: ALICE })).status).toBe(200);
  await stack.client.sandboxes.destroy(sandboxId);
  await stack.client.runs.cancel(runId);
}, 180_000);

/** Every string in `value`, byte payloads (Temporal payloads) decoded as UTF-8. */
function strings(value: unknown, found: string[] = [], seen = new Set<unknown>()): string[] {
  if (value === null || value === undefined || seen.has(value)) return found;
  if (typeof value === 'string') found.push(value);
  else if (value instanceof Uint8Array) found.push(Buffer.from(value).toString('utf8'));
  else if (typeof value === 'object') {
    seen.add(value);
    for (const v of Object.values(value as Record<string, unknown>)) strings(v, found, seen);
  }
  return found;
}

/** The secrets (also base64-encoded) found in any string or payload of `value`. */
function leaks(value: unknown): string[] {
  return strings(value).flatMap((text) =>
    SECRETS.filter((secret) => text.includes(secret) || text.includes(Buffer.from(secret).toString('base64'))).map(
      (secret) => `${secret} in ${text.slice(0, 200)}`,
    ),
  );
}

test('secrets never reach a log line (API at trace level, worker) nor the history of Runs answered through the API', async () => {
  const runs = [await waitingRun(), await waitingRun()];
  // Answered through the API by alice and bob; also refused attempts with forged and partial secrets.
  for (const [i, runId] of runs.entries()) {
    const token = i === 0 ? ALICE : BOB;
    expect(
      (await call('POST', `/api/v1/runs/${runId}/interactions/int-1`, { token: FORGED, body: { decision: 'deny' } }))
        .status,
    ).toBe(401);
    const answered = await call('POST', `/api/v1/runs/${runId}/interactions/int-1`, {
      token,
      body: { decision: 'approve', comment: 'ok' },
    });
    expect(answered.status).toBe(200);
    expect(answered.json).toMatchObject({ respondedBy: i === 0 ? 'alice' : 'bob' });
    expect(
      (await call('POST', `/api/v1/runs/${runId}/interactions/int-1`, { token, body: { decision: 'deny' } })).status,
    ).toBe(409);
    await stack.temporal.workflow.getHandle(runId).result();
  }
  // A sign-in link, a malformed request, and requests that fail on the server side (Temporal unreachable: 503, logged as an error).
  expect((await call('GET', `/?token=${ALICE}`)).status).toBe(200);
  expect(
    (await call('POST', '/api/v1/runs', { token: ALICE, raw: '{"agent":', contentType: 'application/json' })).status,
  ).toBe(400);
  const deadLog: string[] = [];
  const deadClient = new StasisClient(
    new Client({ connection: Connection.lazy({ address: '127.0.0.1:1', connectTimeout: 1_000, interceptors: [] }) }),
  );
  const dead = buildApi({
    client: deadClient,
    tokens: [{ name: 'alice', secret: ALICE, role: 'operator' }],
    logger: { level: 'trace', destination: logSink(deadLog) },
  });
  await dead.listen({ host: '127.0.0.1', port: 0 });
  const deadAddress = dead.server.address();
  const deadCall = httpClient(
    `http://127.0.0.1:${typeof deadAddress === 'object' && deadAddress ? deadAddress.port : 0}`,
  );
  const failed = await deadCall('GET', '/api/v1/runs/run-x', { token: ALICE });
  await dead.close();
  expect(failed.status).toBeGreaterThanOrEqual(500);
  expect(deadLog.join('')).toMatch(/request failed/);

  const checks: [string, unknown][] = [
    ['API log', apiLog],
    ['API log with server errors', deadLog],
    ['worker log', workerLogs],
    ...(await Promise.all(
      runs.map(async (runId): Promise<[string, unknown]> => [
        `history of ${runId}`,
        await historyEvents(stack.temporal, runId),
      ]),
    )),
  ];
  for (const [what, value] of checks) {
    tally.start(what, `${what}: a secret leaked`);
    tally.inject(SECRETS.length);
    expect({ what, leaks: leaks(value) }).toEqual({ what, leaks: [] });
    tally.ok(what);
  }
  // The log did see the requests (so the check above looked at something), with the sign-in token redacted.
  expect(apiLog.join('')).toContain('"url":"/?token=[redacted]"');
  expect(apiLog.join('')).toContain(`/api/v1/runs/${runs[0]}/interactions/int-1`);
  // The history does carry who answered: the token's name, never its secret.
  const history = strings(await historyEvents(stack.temporal, runs[1]));
  expect(history.some((text) => text.includes('"respondedBy":"bob"'))).toBe(true);
}, 180_000);

test('under bwrap a sandbox cannot read or write another sandbox’s workspace, nor see the worker’s secrets', async () => {
  const { sandboxId: a } = await stack.client.sandboxes.create({ provider: 'bwrap' });
  const { sandboxId: b } = await stack.client.sandboxes.create({ provider: 'bwrap' });
  const { sandboxId: control } = await stack.client.sandboxes.create({ provider: 'local' });
  for (const id of [a, b, control]) await stack.client.sandboxes.start(id);
  await stack.client.sandboxes.writeFile(a, 'secret.txt', Buffer.from('SECRET-OF-A'));
  const aWorkspace = path.join(stack.config.STASIS_DATA_DIR, 'hosts', 'host-a', 'sandboxes', a, 'volume', 'workspace');
  const aRoot = path.dirname(path.dirname(aWorkspace));

  // The control: without bwrap the path is right there, so the refusals below are bwrap's doing.
  await expect(
    stack.client.sandboxes.exec(control, { command: `cat ${aWorkspace}/secret.txt` }),
  ).resolves.toMatchObject({ exitCode: 0, stdout: 'SECRET-OF-A' });

  const attempts: [string, string][] = [
    ['its host path', `cat ${aWorkspace}/secret.txt`],
    [
      'a path relative to /workspace',
      `cat ../../../${a}/volume/workspace/secret.txt ../../${a}/volume/workspace/secret.txt`,
    ],
    ['the data dir', `ls -R ${stack.config.STASIS_DATA_DIR} ${aRoot}`],
    [
      'another process’s root in /proc',
      'cat /proc/*/root/workspace/secret.txt /proc/*/cwd/secret.txt | grep SECRET-OF-A',
    ],
    [
      'a search of every mounted directory',
      'grep -rs SECRET-OF-A /workspace /home /envs /tmp /etc /dev /proc/self/cwd',
    ],
    ['a write into it', `echo pwned > ${aWorkspace}/pwned.txt`],
  ];
  for (const [how, command] of attempts) {
    const id = `bwrap: ${how}`;
    tally.start(id, `${id}: reached sandbox A`);
    tally.inject();
    const outcome = await stack.client.sandboxes.exec(b, { command });
    expect({
      how,
      exitCode: outcome.exitCode === 0 ? 0 : 'failed',
      leaked: outcome.stdout.includes('SECRET-OF-A'),
    }).toEqual({ how, exitCode: 'failed', leaked: false });
    tally.ok(id);
  }
  // Through the file API: a link planted in B pointing into A is not followed out of B's workspace.
  await stack.client.sandboxes.exec(b, { command: `ln -s ${aWorkspace}/secret.txt link.txt` });
  tally.start('file API via a link', 'file API via a link: read A');
  tally.inject();
  await expect(stack.client.sandboxes.readFile(b, 'link.txt')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  tally.ok('file API via a link');
  // A is untouched and still has its file; no credentials of the worker are visible inside B.
  await expect(stack.client.sandboxes.exec(a, { command: 'ls; cat secret.txt' })).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'secret.txt\nSECRET-OF-A',
  });
  const environment = await stack.client.sandboxes.exec(b, { command: 'env; cat /proc/1/environ | tr "\\0" "\\n"' });
  tally.start('worker credentials', 'worker credentials visible in a sandbox');
  tally.inject();
  for (const name of ['AWS_SECRET_ACCESS_KEY', 'AWS_ACCESS_KEY_ID', 'STASIS_API_TOKENS', 'TEMPORAL_ADDRESS'])
    expect(environment.stdout).not.toContain(name);
  const secret = process.env.AWS_SECRET_ACCESS_KEY;
  if (secret) expect(environment.stdout).not.toContain(secret);
  tally.ok('worker credentials');
  for (const id of [a, b, control]) await stack.client.sandboxes.destroy(id);
}, 180_000);

test('summary: nobody let in, nothing leaked', () => {
  writeSummary('security', tally);
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBeGreaterThan(200);
});
