import { isUtf8 } from 'node:buffer';
import * as net from 'node:net';
import fc from 'fast-check';
import type { FastifyInstance } from 'fastify';
import { apiRoutes } from '../../api/routes';
import { buildApi } from '../../api/server';
import type { StasisClient } from '../../client';

// Requests Node's HTTP parser refuses never reach fastify's routes or hooks; their answers
// must still be the API's `{error: {code, message}}` with the status of the code.

const TOKEN = { name: 'ops', secret: 'operator-secret-0123456789', role: 'operator' } as const;
let app: FastifyInstance;
let port: number;

beforeAll(async () => {
  // No request here gets as far as the client: one that did would fail (500), its client being empty.
  const empty = { withIdentity: () => ({}) } as unknown as StasisClient;
  app = buildApi({ client: empty, tokens: [TOKEN], logger: false });
  await app.listen({ host: '127.0.0.1', port: 0 });
  port = (app.server.address() as net.AddressInfo).port;
});
afterAll(async () => {
  await app?.close();
});

/** Sends these exact bytes and reads the whole answer (the server closes the connection). */
function raw(request: Buffer): Promise<{ status: number; type: string; body: string; head: string }> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = net.connect(port, '127.0.0.1', () => socket.write(request));
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      const [head, ...body] = text.split('\r\n\r\n');
      resolve({
        status: Number(/^HTTP\/1\.1 (\d+)/.exec(head)?.[1] ?? 0),
        type: /^content-type: *(.*)$/im.exec(head)?.[1] ?? '',
        body: body.join('\r\n\r\n'),
        head,
      });
    });
  });
}

const withAuthorization = (value: Buffer) =>
  Buffer.concat([
    Buffer.from('GET /api/v1/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: '),
    value,
    Buffer.from('\r\n\r\n'),
  ]);

/** status, code: the answer as the contract has it, or what it was instead. */
function answer(r: { status: number; type: string; body: string }): string {
  try {
    const { error } = JSON.parse(r.body) as { error?: { code?: unknown; message?: unknown } };
    if (typeof error?.code === 'string' && typeof error.message === 'string' && r.type.startsWith('application/json'))
      return `${r.status} ${error.code}`;
  } catch {
    // not JSON: shown below
  }
  return `${r.status} not the contract: ${r.type} ${JSON.stringify(r.body.slice(0, 80))}`;
}

test('a header with a control character is 400 INVALID_ARGUMENT, oversized headers 431 HEADERS_TOO_LARGE', async () => {
  const control = await raw(withAuthorization(Buffer.from('Bearer abc\u0001def', 'latin1')));
  const oversized = await raw(withAuthorization(Buffer.from(`Bearer ${'a'.repeat(20_000)}`, 'latin1')));
  const garbage = await raw(Buffer.from('NOT HTTP AT ALL\r\n\r\n'));
  expect({ control: answer(control), oversized: answer(oversized), garbage: answer(garbage) }).toEqual({
    control: '400 INVALID_ARGUMENT',
    oversized: '431 HEADERS_TOO_LARGE',
    garbage: '400 INVALID_ARGUMENT',
  });
  // Like every answer of the server: not cached, not sniffed.
  const headers = (r: { head: string }) => [
    /^cache-control: *(.*)$/im.exec(r.head)?.[1],
    /^x-content-type-options: *(.*)$/im.exec(r.head)?.[1],
  ];
  expect([control, oversized, garbage].map(headers)).toEqual(Array(3).fill(['no-store', 'nosniff']));
});

test('property: any control character in a header value is answered in the contract', async () => {
  const controls = [...Array(32).keys()].filter((c) => c !== 9 && c !== 10 && c !== 13);
  await fc.assert(
    fc.asyncProperty(fc.constantFrom(...controls), fc.string({ maxLength: 20 }), async (c, rest) => {
      const value = Buffer.concat([Buffer.from(`Bearer ${rest.replace(/[^ -~]/g, '')}`), Buffer.from([c])]);
      expect(answer(await raw(withAuthorization(value)))).toBe('400 INVALID_ARGUMENT');
    }),
    { numRuns: 60 },
  );
});

/** Every route that takes a JSON body, its path parameters filled in. */
const JSON_BODY_ROUTES = apiRoutes()
  .filter((r) => r.body !== undefined && r.body !== 'bytes')
  .map((r) => ({ method: r.method, path: r.path.replace(/\{\w+\}/g, 'x1') }));

/** A request to `route` with these exact body bytes, as JSON. */
const withJsonBody = (route: { method: string; path: string }, body: Buffer) =>
  Buffer.concat([
    Buffer.from(
      `${route.method} ${route.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TOKEN.secret}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`,
      'latin1',
    ),
    body,
  ]);

/** `{error: {code, message}}` of an answer (undefined when it is not one). */
const errorOf = (r: { body: string }) => {
  try {
    return (JSON.parse(r.body) as { error?: { code: string; message: string } }).error;
  } catch {
    return undefined;
  }
};

test('property: a JSON body that is not UTF-8 is 400 "body: not valid UTF-8" on every JSON route, never read as U+FFFD', async () => {
  expect(JSON_BODY_ROUTES.length).toBeGreaterThan(5);
  // Bytes as they come off the wire, kept only when they are not UTF-8 (Node's own validator decides).
  const notUtf8 = fc.uint8Array({ minLength: 1, maxLength: 12 }).filter((b) => !isUtf8(b));
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...JSON_BODY_ROUTES),
      fc.constantFrom('comment', 'command', 'provider', 'decision', 'input'),
      fc.string({ maxLength: 10 }),
      notUtf8,
      async (route, field, before, bad) => {
        // Inside a JSON string, where a string parser took the bad bytes as U+FFFD and went on.
        const body = Buffer.concat([
          Buffer.from(`{"${field}":${JSON.stringify(before).slice(0, -1)}`),
          bad,
          Buffer.from('"}'),
        ]);
        const r = await raw(withJsonBody(route, body));
        // The client here is empty: a request that got past the parser would have failed with 500.
        expect({ status: r.status, error: errorOf(r) }).toEqual({
          status: 400,
          error: { code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^body: not valid UTF-8/) },
        });
        expect(r.head).toMatch(/^cache-control: *no-store/im);
      },
    ),
    { numRuns: 150 },
  );
});

test('property: a JSON body that is UTF-8 passes the parser, whatever characters it holds', async () => {
  await fc.assert(
    fc.asyncProperty(fc.string({ unit: 'grapheme', maxLength: 20 }), async (text) => {
      // An unknown field: the schema, after the parser, names it.
      const body = Buffer.from(JSON.stringify({ command: 'true', unknownField: text }), 'utf8');
      const r = await raw(withJsonBody({ method: 'POST', path: '/api/v1/sandboxes/x1/exec' }, body));
      expect({ status: r.status, message: errorOf(r)?.message }).toEqual({
        status: 400,
        message: expect.stringContaining('unknownField'),
      });
    }),
    { numRuns: 60 },
  );
});

test('property: a `__proto__` key anywhere in a JSON body, however it is escaped, is 400 naming its path (not "not valid JSON")', async () => {
  // Each character of the key as itself or as a \uXXXX escape: JSON.parse reads them all as `__proto__`.
  const spelledProto = fc
    .array(fc.boolean(), { minLength: 9, maxLength: 9 })
    .map((escaped) =>
      [...'__proto__'].map((c, i) => (escaped[i] ? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}` : c)).join(''),
    );
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...JSON_BODY_ROUTES),
      fc.array(fc.constantFrom('labels', 'env', 'agent', 'spec', 'a'), { maxLength: 3 }),
      spelledProto,
      fc.jsonValue({ maxDepth: 1 }),
      async (route, keys, key, value) => {
        const text = keys.reduceRight(
          (inner, k) => `{"x":1,"${k}":${inner}}`,
          `{"team":"a","${key}":${JSON.stringify(value)}}`,
        );
        const r = await raw(withJsonBody(route, Buffer.from(text)));
        expect({ status: r.status, error: errorOf(r) }).toEqual({
          status: 400,
          error: {
            code: 'INVALID_ARGUMENT',
            message: `${['body', ...keys, '__proto__'].join('.')}: the key "__proto__" is not accepted (it would set an object's prototype)`,
          },
        });
        // Nothing reached a prototype on the way.
        expect(Object.keys(Object.prototype)).toEqual([]);
      },
    ),
    { numRuns: 150 },
  );
  const ctor = await raw(
    withJsonBody(
      { method: 'POST', path: '/api/v1/sandboxes' },
      Buffer.from('{"provider":"local","labels":{"constructor":{"prototype":{"x":"y"}}}}'),
    ),
  );
  expect(errorOf(ctor)?.message).toMatch(/^body\.labels\.constructor\.prototype: the key "prototype" inside/);
});

test('property: a query parameter a route does not name (a misspelt filter, waitMs, limit) is 400 naming it on every route', async () => {
  // A valid body where a route needs one, so only the query is wrong.
  const bodies: Record<string, string> = {
    'POST /api/v1/runs/{id}/actions': '{"actionId":"a1","action":{"type":"complete"}}',
  };
  const routes = apiRoutes()
    .filter(
      (r) =>
        r.body === undefined ||
        r.body === 'bytes' ||
        r.body.safeParse(undefined).success ||
        bodies[`${r.method} ${r.path}`],
    )
    .map((r) => ({
      method: r.method,
      path: r.path.replace(/\{\w+\}/g, 'x1'),
      known: Object.keys(r.query?.shape ?? {}),
      // A route's required parameters, given, so only the unknown one is wrong.
      given: r.query?.shape.path ? 'path=a.txt&' : '',
      body: bodies[`${r.method} ${r.path}`] ?? '',
    }));
  expect(routes.map((r) => `${r.method} ${r.path}`)).toEqual(
    expect.arrayContaining([
      'GET /api/v1/runs',
      'GET /api/v1/interactions',
      'POST /api/v1/runs/x1/actions',
      'GET /api/v1/sandboxes/x1/files',
    ]),
  );
  const knownNames = ['status', 'limit', 'after', 'waitMs', 'state', 'label', 'pageSize', 'nextPageToken', 'path'];
  // Near misses of the real names (case, a letter dropped or doubled) and any other name, as sent on the wire.
  const nearMiss = fc
    .tuple(fc.constantFrom(...knownNames), fc.nat(), fc.constantFrom('case', 'drop', 'double'))
    .map(([name, at, how]) => {
      const i = at % name.length;
      if (how === 'case') return name.toLowerCase() === name ? name.toUpperCase() : name.toLowerCase();
      if (how === 'drop') return name.slice(0, i) + name.slice(i + 1);
      return name.slice(0, i) + name[i] + name.slice(i);
    });
  const anyName = fc.oneof(fc.string({ minLength: 1, maxLength: 10 }), fc.constantFrom('__proto__', 'constructor'));
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...routes),
      fc.oneof(nearMiss, anyName),
      fc.string({ maxLength: 8 }),
      async (route, name, value) => {
        fc.pre(!route.known.includes(name) && name !== '');
        const target = `${route.path}?${route.given}${encodeURIComponent(name)}=${encodeURIComponent(value)}`;
        const r = await raw(
          Buffer.from(
            `${route.method} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TOKEN.secret}\r\n` +
              `Content-Type: application/json\r\nContent-Length: ${route.body.length}\r\nConnection: close\r\n\r\n${route.body}`,
          ),
        );
        // The client here is empty: a request that got past the query would have failed with 500.
        expect({ status: r.status, error: errorOf(r) }).toEqual({
          status: 400,
          error: {
            code: 'INVALID_ARGUMENT',
            message: expect.stringContaining(`query: Unrecognized key: "${name}"`),
          },
        });
      },
    ),
    { numRuns: 200 },
  );
});

test('property: a CONNECT request is answered in the contract (404, or 401 under /api without a token), no-store, then closed', async () => {
  const target = fc.oneof(
    // authority-form, as a proxy client sends it
    fc.tuple(fc.domain(), fc.integer({ min: 1, max: 65_535 })).map(([host, port]) => `${host}:${port}`),
    fc.constantFrom('127.0.0.1:7233', '[::1]:9000', '/api/v1/me', '/api/v1/runs?status=WAITING', '/', '/metrics'),
    fc.webPath().map((p) => `/api${p.startsWith('/') ? p : `/${p}`}`),
  );
  await fc.assert(
    fc.asyncProperty(target, fc.boolean(), async (to, signed) => {
      const headers = signed ? `Authorization: Bearer ${TOKEN.secret}\r\n` : '';
      const r = await raw(Buffer.from(`CONNECT ${to} HTTP/1.1\r\nHost: ${to}\r\n${headers}\r\n`, 'latin1'));
      const underApi = /^\/api(\/|\?|$)/.test(to);
      expect({ to, answer: answer(r) }).toEqual({
        to,
        answer: underApi && !signed ? '401 UNAUTHORIZED' : '404 NOT_FOUND',
      });
      expect(r.head).toMatch(/^cache-control: *no-store/im);
      expect(r.head).toMatch(/^x-content-type-options: *nosniff/im);
    }),
    { numRuns: 80 },
  );
  // The server still serves after them.
  const me = await raw(
    Buffer.from(
      `GET /api/v1/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TOKEN.secret}\r\nConnection: close\r\n\r\n`,
    ),
  );
  expect(me.status).toBe(200);
});
