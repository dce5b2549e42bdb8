import { Client, Connection } from '@temporalio/client';
import * as fc from 'fast-check';
import { StasisClient, StasisError } from '../../client';
import { ConfigError, loadConfig } from '../../common/config';
import { MAX_ACTION_WAIT_MS } from '../../common/external-actions';
import { ClientIdentity, RunId } from '../../common/schemas';
import { ACTOR_MAX } from '../../common/wire-checks';
import { freePort } from '../../platform/servers';

// The typed client refuses a Run id no Run can have and a list limit out of bounds
// itself, with a clear code, before Temporal is asked: Temporal answered an empty or
// oversized workflow id with an opaque INTERNAL ("Workflow Update failed").

/** A Temporal client that notes being asked anything and then fails. */
function untouchable(): { client: Client; asked: () => boolean } {
  let asked = false;
  const trap = (): never => {
    asked = true;
    throw new Error('Temporal was asked');
  };
  const client = new Proxy({}, { get: trap }) as unknown as Client;
  return { client, asked: () => asked };
}

/** Every Run operation of the client, on `runId`. */
function runOperations(runs: StasisClient['runs'], runId: string): (() => Promise<unknown>)[] {
  return [
    () => runs.get(runId),
    () => runs.resource(runId),
    () => runs.respond(runId, 'int-1', { decision: 'approve' }),
    () => runs.respondBySignal(runId, 'int-1', { decision: 'approve' }),
    () => runs.suspend(runId),
    () => runs.resume(runId),
    () => runs.cancel(runId),
    () => runs.act(runId, { actionId: 'a1', action: { type: 'exec', command: 'true' } }),
    () => runs.action(runId, 'a1'),
  ];
}

/** What each Run operation of the client answers for `runId`, and whether Temporal was asked. */
async function outcomes(runId: string): Promise<{ codes: unknown[]; asked: boolean }> {
  const temporal = untouchable();
  const runs = new StasisClient(temporal.client).runs;
  const attempts = runOperations(runs, runId);
  const codes: unknown[] = [];
  for (const attempt of attempts) {
    const err = await attempt().then(
      () => undefined,
      (e: unknown) => e as { code?: string; message?: string },
    );
    codes.push(err?.code === 'INVALID_ARGUMENT' && err.message?.startsWith('runId "') ? 'INVALID_ARGUMENT' : err);
  }
  return { codes, asked: temporal.asked() };
}

const notRunIds = fc.oneof(
  fc.constantFrom('', ' ', 'a'.repeat(129), 'ü/..', '-x', 'run-1\n', 'run 1'),
  fc.string({ unit: 'binary', maxLength: 200 }),
);

test('an id that is not a Run id is INVALID_ARGUMENT naming it, for every Run operation, and Temporal is not asked; a sandbox workflow id is NOT_FOUND', async () => {
  await fc.assert(
    fc.asyncProperty(
      notRunIds.filter((id) => !RunId.safeParse(id).success && !id.startsWith('sandbox-')),
      async (id) => {
        expect(await outcomes(id)).toEqual({ codes: Array(9).fill('INVALID_ARGUMENT'), asked: false });
      },
    ),
    { numRuns: 50 },
  );
  const long = await new StasisClient(untouchable().client).runs.get('b'.repeat(2000)).catch((e: unknown) => e);
  expect((long as Error).message).toMatch(/^runId "b{64}…": not a Run id \(.*128.*\)$/);

  // A sandbox's workflow id is well-formed and names no Run: NOT_FOUND; a well-formed Run id goes on to Temporal.
  const sandbox = await outcomes('sandbox-abc');
  expect(sandbox).toEqual({
    codes: Array(9).fill(expect.objectContaining({ code: 'NOT_FOUND', message: 'run sandbox-abc not found' })),
    asked: false,
  });
  expect((await outcomes('run-1.child-2')).asked).toBe(true);
});

test('list and pendingInteractions refuse a limit that is not a whole number from 1 to the REST bound', async () => {
  for (const limit of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 1001]) {
    const temporal = untouchable();
    const runs = new StasisClient(temporal.client).runs;
    await expect(runs.list({ limit })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /^limit: / });
    await expect(runs.pendingInteractions({ limit })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: /^limit: /,
    });
    expect([limit, temporal.asked()]).toEqual([limit, false]);
  }
  // Within the bound the list goes on to Temporal.
  const temporal = untouchable();
  await new StasisClient(temporal.client).runs.list({ limit: 1000 }).catch(() => undefined);
  expect(temporal.asked()).toBe(true);
});

/** What `call` threw (code and message), or 'resolved'. */
async function refusal(call: () => Promise<unknown>): Promise<{ code?: string; message?: string } | 'resolved'> {
  return call().then(
    () => 'resolved' as const,
    (e: unknown) => ({ code: (e as { code?: string }).code, message: (e as Error).message }),
  );
}

// Plain-JS callers pass anything: each refusal names its argument, and Temporal is not asked.
const notIds: unknown[] = [undefined, null, 123, '', 'bad id', 'x'.repeat(2000)];

test('every Run operation refuses a runId that is not a string as INVALID_ARGUMENT naming runId', async () => {
  const temporal = untouchable();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const runs = new StasisClient(temporal.client).runs as any;
  for (const runId of [undefined, null, 123, {}]) {
    const calls = runOperations(runs, runId as string);
    for (const call of calls)
      expect([runId, await refusal(call)]).toEqual([
        runId,
        { code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^runId: must be a string/) },
      ]);
  }
  expect(temporal.asked()).toBe(false);
});

test('list and pendingInteractions refuse a filter that is not an object, and list a status that is not one', async () => {
  const temporal = untouchable();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const runs = new StasisClient(temporal.client).runs as any;
  for (const call of [() => runs.list(null), () => runs.list(5)])
    expect(await refusal(call)).toEqual({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^filter: /) });
  for (const call of [() => runs.pendingInteractions(null), () => runs.pendingInteractions('x')])
    expect(await refusal(call)).toEqual({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^page: /) });
  // A status is checked, never spliced into the visibility query as it is.
  for (const status of ['BOGUS', "x'", "RUNNING' OR StasisKind = 'sandbox", 5, null]) {
    expect(await refusal(() => runs.list({ status }))).toEqual({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/^status: /),
    });
  }
  expect(temporal.asked()).toBe(false);
});

test('respond, respondBySignal and action refuse a bad interaction or action id, options and their fields, naming them', async () => {
  const temporal = untouchable();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const runs = new StasisClient(temporal.client).runs as any;
  const approve = { decision: 'approve' };
  const refused = (field: string) => ({
    code: 'INVALID_ARGUMENT',
    message: expect.stringMatching(new RegExp(`^${field}[ :]`)),
  });
  for (const id of notIds) {
    expect(await refusal(() => runs.respond('run-1', id, approve))).toEqual(refused('interactionId'));
    expect(await refusal(() => runs.respondBySignal('run-1', id, approve))).toEqual(refused('interactionId'));
    expect(await refusal(() => runs.action('run-1', id))).toEqual(refused('actionId'));
  }
  for (const options of [null, 5, 'x']) {
    expect(await refusal(() => runs.respond('run-1', 'int-1', approve, options))).toEqual(refused('options'));
    expect(await refusal(() => runs.respondBySignal('run-1', 'int-1', approve, options))).toEqual(refused('options'));
  }
  // An empty respondedBy was recorded as 'anonymous'; REST's own names are 1-256 characters. A name
  // with a control, bidi or invisible character, or a lone surrogate, reads as another one.
  for (const respondedBy of ['', 123, 'x'.repeat(257), 'alice\u200b', 'bob\u0007', 'a\u{e0041}', '\ud800']) {
    expect(await refusal(() => runs.respond('run-1', 'int-1', approve, { respondedBy }))).toEqual(
      refused('options: respondedBy'),
    );
    expect(await refusal(() => runs.respondBySignal('run-1', 'int-1', approve, { respondedBy }))).toEqual(
      refused('options: respondedBy'),
    );
  }
  for (const updateId of ['', 'x'.repeat(5000), 42, 'a b'])
    expect(await refusal(() => runs.respond('run-1', 'int-1', approve, { updateId }))).toEqual(
      refused('options: updateId'),
    );
  expect(temporal.asked()).toBe(false);
});

test('act refuses a waitMs that is not a whole number of milliseconds within the bound REST takes', async () => {
  const temporal = untouchable();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const runs = new StasisClient(temporal.client).runs as any;
  const request = { actionId: 'a1', action: { type: 'exec', command: 'true' } };
  for (const waitMs of [Number.NaN, '100', -5, 1.5, MAX_ACTION_WAIT_MS + 1, Number.POSITIVE_INFINITY, null]) {
    expect([waitMs, await refusal(() => runs.act('run-1', request, { waitMs }))]).toEqual([
      waitMs,
      { code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^options: waitMs: /) },
    ]);
  }
  expect(temporal.asked()).toBe(false);
  // Within the bound the action goes on to Temporal.
  const bounded = untouchable();
  await new StasisClient(bounded.client).runs.act('run-1', request, { waitMs: 0 }).catch(() => undefined);
  expect(bounded.asked()).toBe(true);
});

test('every sandbox operation refuses a sandboxId that is not an id as INVALID_ARGUMENT naming sandboxId', async () => {
  const temporal = untouchable();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const sandboxes = new StasisClient(temporal.client).sandboxes as any;
  for (const id of notIds) {
    const calls = [
      () => sandboxes.get(id),
      ...['start', 'stop', 'pause', 'resume', 'suspend', 'destroy'].map((op) => () => sandboxes[op](id)),
      () => sandboxes.exec(id, { command: 'true' }),
      () => sandboxes.readFile(id, 'a.txt'),
      () => sandboxes.writeFile(id, 'a.txt', Buffer.from('x')),
    ];
    for (const call of calls)
      expect([id, await refusal(call)]).toEqual([
        id,
        { code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^sandboxId[ :]/) },
      ]);
  }
  expect(temporal.asked()).toBe(false);
});

test("writeFile takes a Buffer or Uint8Array's bytes, and refuses any other content (a string was written as garbage)", async () => {
  const temporal = untouchable();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const sandboxes = new StasisClient(temporal.client).sandboxes as any;
  for (const content of ['data', null, undefined, 42, [104, 105]])
    expect(await refusal(() => sandboxes.writeFile('sbx-1', 'a.txt', content))).toEqual({
      code: 'INVALID_ARGUMENT',
      message: 'content: must be a Buffer or Uint8Array',
    });
  expect(temporal.asked()).toBe(false);

  // What the Update carries: the bytes themselves (a Uint8Array's toString ignores 'base64').
  const sent: unknown[] = [];
  const recording = {
    workflow: {
      getHandle: () => ({
        // The queue check (a sandbox of this client's default queue).
        describe: async () => ({ taskQueue: 'stasis', type: 'sandboxWorkflow', status: { name: 'RUNNING' }, raw: {} }),
        executeUpdate: async (_def: unknown, options: { args: unknown[] }) => void sent.push(options.args[0]),
      }),
    },
  } as unknown as Client;
  const client = new StasisClient(recording).sandboxes;
  await client.writeFile('sbx-1', 'a.txt', new Uint8Array([104, 105]));
  await client.writeFile('sbx-1', 'b.txt', Buffer.from('hi'));
  expect(sent).toEqual([
    { path: 'a.txt', contentBase64: Buffer.from('hi').toString('base64') },
    { path: 'b.txt', contentBase64: Buffer.from('hi').toString('base64') },
  ]);
});

test('checked input refuses what REST refuses as JSON: a "__proto__" key (zod dropped it silently) and a lone surrogate', async () => {
  const temporal = untouchable();
  const { runs, sandboxes } = new StasisClient(temporal.client);
  const refusedAt = (at: string) => ({ code: 'INVALID_ARGUMENT', message: expect.stringContaining(at) });
  const spec = JSON.parse(
    '{"agent":{"driver":"scripted","steps":[{"complete":"x"}]},"sandbox":{"provider":"local"},"labels":{"__proto__":"evil","team":"a"}}',
  );
  expect(await refusal(() => runs.start(spec))).toEqual(refusedAt('spec.labels.__proto__'));
  const sandbox = JSON.parse('{"provider":"local","labels":{"__proto__":"x","t":"y"}}');
  expect(await refusal(() => sandboxes.create(sandbox))).toEqual(refusedAt('sandbox.labels.__proto__'));
  const exec = JSON.parse('{"command":"true","env":{"__proto__":"x","A":"b"}}');
  expect(await refusal(() => sandboxes.exec('sbx-1', exec))).toEqual(refusedAt('exec.env.__proto__'));
  const answer = JSON.parse('{"decision":"approve","__proto__":{"x":1}}');
  expect(await refusal(() => runs.respond('run-1', 'int-1', answer))).toEqual(refusedAt('__proto__'));

  // A lone surrogate cannot travel as UTF-8: Temporal's payloads turned it into U+FFFD.
  expect(await refusal(() => sandboxes.exec('sbx-1', { command: 'echo \ud800' }))).toEqual(
    refusedAt('exec.command: must be well-formed Unicode'),
  );
  expect(await refusal(() => runs.respond('run-1', 'int-1', { decision: 'approve', comment: 'ok \udc00' }))).toEqual(
    refusedAt('response.comment: must be well-formed Unicode'),
  );
  expect(temporal.asked()).toBe(false);
});

test('respondBySignal refuses an answer over the input limit as respond does (it went into the history, 1.8 MB a signal)', async () => {
  const temporal = untouchable();
  const { runs } = new StasisClient(temporal.client);
  const response = { input: '€'.repeat(600_000) };
  for (const call of [
    () => runs.respond('run-1', 'int-1', response),
    () => runs.respondBySignal('run-1', 'int-1', response),
  ])
    expect(await refusal(call)).toEqual({ code: 'PAYLOAD_TOO_LARGE', message: expect.stringMatching(/^response/) });
  expect(temporal.asked()).toBe(false);
});

// The connection itself, against the Temporal server of the global setup.
const address = () => process.env.TEMPORAL_ADDRESS!;

test("connect({connection}) takes the environment's namespace when none is given, as the option's doc says", async () => {
  const saved = process.env.TEMPORAL_NAMESPACE;
  process.env.TEMPORAL_NAMESPACE = 'no-such-namespace';
  try {
    // It used `default` and connected.
    await expect(StasisClient.connect({ connection: { address: address() } })).rejects.toThrow(
      'TEMPORAL_NAMESPACE: "no-such-namespace" does not exist',
    );
    const given = await StasisClient.connect({ connection: { address: address() }, namespace: saved ?? 'default' });
    expect(given.temporal.options.namespace).toBe(saved ?? 'default');
    await given.close();
  } finally {
    if (saved === undefined) delete process.env.TEMPORAL_NAMESPACE;
    else process.env.TEMPORAL_NAMESPACE = saved;
  }
});

test('after close() every call is UNAVAILABLE "the client is closed" (was INTERNAL "Channel has been shut down"); close() twice is fine', async () => {
  const client = await StasisClient.connect({ connection: { address: address() } });
  const bob = client.withIdentity('bob');
  await client.close();
  await client.close();
  const spec = { agent: { driver: 'scripted', steps: [{ complete: 1 }] }, sandbox: { provider: 'local' } };
  const calls = [
    () => client.runs.get('run-x'),
    () => client.runs.list(),
    () => client.runs.pendingInteractions(),
    () => client.runs.start(spec),
    () => client.runs.respond('run-x', 'int-1', { decision: 'approve' }),
    () => client.runs.act('run-x', { actionId: 'a1', action: { type: 'exec', command: 'true' } }),
    () => client.sandboxes.get('sbx-x'),
    () => client.sandboxes.list(),
    () => client.sandboxes.create({ provider: 'local' }),
    () => client.sandboxes.start('sbx-x'),
    () => client.metricsSnapshot(),
    () => bob.runs.get('run-x'),
  ];
  for (const [i, call] of calls.entries())
    expect([i, await refusal(call)]).toEqual([i, { code: 'UNAVAILABLE', message: 'the client is closed' }]);
});

test('connect() to a server that is down is UNAVAILABLE naming the address (was a raw Error)', async () => {
  const down = `127.0.0.1:${await freePort()}`;
  const err = await StasisClient.connect({ connection: { address: down }, namespace: 'default' }).catch(
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StasisError);
  expect(err).toMatchObject({ code: 'UNAVAILABLE', message: expect.stringContaining(down) });
}, 60_000);

// withIdentity's identity is recorded by Temporal on every event the client causes and shown in
// Temporal Web: it was taken as given (undefined, 123, '', 10,000 characters, a newline or an ANSI
// escape), to fail later or be shown as sent.

/** Identities withIdentity refuses: not strings, empty, too long, with a control character, or not well-formed. */
const badIdentities = fc.oneof(
  fc.constantFrom<unknown>(
    undefined,
    null,
    123,
    '',
    {},
    ['bob'],
    'x'.repeat(257),
    '€'.repeat(400),
    'bob\n',
    'a\u202eb',
    'alice\u200b',
  ),
  fc.anything().filter((v) => typeof v !== 'string'),
  fc.string({ minLength: ACTOR_MAX + 1, maxLength: ACTOR_MAX + 50 }),
  fc
    .tuple(
      fc.string({ maxLength: 20 }),
      fc.constantFrom(
        ...['\u0000', '\n', '\r', '\t', '\u001b', '\u007f', '\u0085', '\u009b', '\u202e', '\u2067', '\ud800'],
        ...['\u200b', '\u200d', '\u200f', '\u061c', '\u2060', '\ufeff', '\u00ad', '\u2028', '\u3164', '\u{e0041}'],
      ),
      fc.string({ maxLength: 20 }),
    )
    .map(([a, bad, b]) => `${a}${bad}${b}`),
);

test('property: withIdentity refuses an identity that is not 1-256 characters free of control characters, at once, as INVALID_ARGUMENT naming identity, and changes nothing', () => {
  const temporal = untouchable();
  const client = new StasisClient(temporal.client);
  fc.assert(
    fc.property(badIdentities, (identity) => {
      let thrown: unknown;
      try {
        client.withIdentity(identity as string);
      } catch (err) {
        thrown = err;
      }
      expect(thrown).toBeInstanceOf(StasisError);
      expect(thrown).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^identity[ :]/) });
    }),
    { numRuns: 300 },
  );
  // Nothing was kept and nothing asked.
  expect((client as unknown as { identities: Map<string, unknown> }).identities.size).toBe(0);
  expect(temporal.asked()).toBe(false);
});

test('property: withIdentity takes every identity of 1-256 characters free of control characters, one client per identity', () => {
  const client = new StasisClient(new Client({ connection: Connection.lazy({ address: '127.0.0.1:1' }) }));
  fc.assert(
    fc.property(
      fc.string({ unit: 'grapheme', minLength: 1, maxLength: 80 }).filter((s) => ClientIdentity.safeParse(s).success),
      (identity) => {
        const derived = client.withIdentity(identity);
        expect(derived.temporal.options.identity).toBe(identity);
        expect(client.withIdentity(identity)).toBe(derived);
      },
    ),
  );
  expect(client.withIdentity('b'.repeat(ACTOR_MAX)).temporal.options.identity).toHaveLength(ACTOR_MAX);
});

// A value JSON cannot carry (a BigInt, a function, a symbol, NaN or Infinity, a circular object) in a
// client's free-form payload surfaced as a raw TypeError ("Do not know how to serialize a BigInt"), or
// was dropped or turned into null on its way to Temporal.

const key = fc.stringMatching(/^[a-z]{1,6}$/);
/**
 * JSON values without the keys `__proto__` or `prototype` (fast-check draws them now and then; findJsonProblem
 * refuses `__proto__`, and `prototype` inside `constructor`).
 */
const plainJson = fc.jsonValue({ maxDepth: 1 }).filter((v) => !/"(__proto__|prototype)"/.test(JSON.stringify(v)));
/** A value JSON cannot carry, and where findJsonProblem names it below the place it is put. */
const notJsonValues = fc.oneof(
  fc.bigInt().map((value) => ({ value: value as unknown, below: [] as string[], what: /a BigInt/ })),
  fc.constant({ value: (() => 1) as unknown, below: [] as string[], what: /a function/ }),
  fc.constant({ value: Symbol('s') as unknown, below: [] as string[], what: /a symbol/ }),
  fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY).map((value) => ({
    value: value as unknown,
    below: [] as string[],
    what: /(NaN|Infinity) is not one/,
  })),
  fc.constant(null).map(() => {
    const circular: Record<string, unknown> = { a: 1 };
    circular.self = circular;
    return { value: circular as unknown, below: ['self'], what: /circular/ };
  }),
  // JSON makes these something else without a word: a Map or Set `{}` (entries lost), a Date a string.
  fc.date({ noInvalidDate: true }).map((value) => ({
    value: value as unknown,
    below: [] as string[],
    what: /a Date is not one: send it as a string/,
  })),
  fc
    .array(fc.tuple(key, fc.integer()), { minLength: 1 })
    .map((entries) => ({ value: new Map(entries) as unknown, below: [] as string[], what: /a Map is not one/ })),
  fc
    .array(fc.integer(), { minLength: 1 })
    .map((items) => ({ value: new Set(items) as unknown, below: [] as string[], what: /a Set is not one/ })),
  fc
    .uint8Array({ minLength: 1 })
    .map((bytes) => ({ value: Buffer.from(bytes) as unknown, below: [] as string[], what: /a Buffer is not one/ })),
  fc.constant(null).map(() => ({
    value: new (class Point {
      x = 1;
    })() as unknown,
    below: [] as string[],
    what: /a Point is not one/,
  })),
  fc.array(fc.integer(), { maxLength: 3 }).map((items) => ({
    value: [...items, undefined] as unknown,
    below: [] as string[],
    what: /an array holding undefined/,
  })),
);
/** `value` at `keys` inside objects that hold other, JSON, fields too. */
const nestedAt = (keys: string[], value: unknown, siblings: Record<string, unknown>[]): unknown =>
  keys.reduceRight<unknown>((inner, k, i) => ({ ...siblings[i], [k]: inner }), value);

/** The client's free-form payloads, each with `value` put in it, and the field named for it. */
const payloadCalls = (runs: StasisClient['runs'], value: unknown): [string, () => Promise<unknown>][] => [
  ['request.action.output', () => runs.act('run-1', { actionId: 'a1', action: { type: 'complete', output: value } })],
  [
    'spec.agent.input',
    () => runs.start({ agent: { driver: 'my-agent', input: value }, sandbox: { provider: 'local' } }),
  ],
  [
    'spec.agent.steps.0.complete',
    () => runs.start({ agent: { driver: 'scripted', steps: [{ complete: value }] }, sandbox: { provider: 'local' } }),
  ],
  [
    'request.action.spec.agent.input',
    () =>
      runs.act('run-1', {
        actionId: 'a1',
        action: {
          type: 'spawn',
          spec: { agent: { driver: 'my-agent', input: value }, sandbox: { provider: 'local' } },
        },
      }),
  ],
];

test('property: a value JSON cannot carry, anywhere in a free-form payload (complete output, agent input), is INVALID_ARGUMENT naming its field, and nothing is sent', async () => {
  await fc.assert(
    fc.asyncProperty(
      notJsonValues,
      fc.array(key, { maxLength: 4 }),
      fc.array(fc.dictionary(key, plainJson, { maxKeys: 3, noNullPrototype: true }), {
        minLength: 4,
        maxLength: 4,
      }),
      async ({ value, below, what }, keys, siblings) => {
        const temporal = untouchable();
        const runs = new StasisClient(temporal.client).runs;
        for (const [field, call] of payloadCalls(runs, nestedAt(keys, value, siblings))) {
          const err = await call().then(
            () => undefined,
            (e: unknown) => e,
          );
          const at = [field, ...keys, ...below].join('.');
          expect(err).toBeInstanceOf(StasisError);
          expect([at, err]).toEqual([
            at,
            expect.objectContaining({
              code: 'INVALID_ARGUMENT',
              message: expect.stringContaining(`${at}: must be a JSON value`),
            }),
          ]);
          expect((err as Error).message).toMatch(what);
        }
        expect(temporal.asked()).toBe(false);
      },
    ),
    { numRuns: 150 },
  );
});

test('an answer holding a value JSON cannot carry is INVALID_ARGUMENT naming its field, and nothing is sent', async () => {
  const temporal = untouchable();
  const { runs } = new StasisClient(temporal.client);
  const circular: Record<string, unknown> = {};
  circular.self = circular;
  for (const comment of [1n, () => 1, Symbol('s'), Number.NaN, circular])
    for (const call of [
      () => runs.respond('run-1', 'int-1', { decision: 'approve', comment }),
      () => runs.respondBySignal('run-1', 'int-1', { decision: 'approve', comment }),
    ])
      expect(await refusal(call)).toEqual({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/^response\.comment(\.self)?: must be a JSON value/),
      });
  expect(temporal.asked()).toBe(false);
});

test("a withIdentity client's close() leaves the connection open for its parent and the other identities; the parent's close() closes it for all", async () => {
  const client = await StasisClient.connect({ connection: { address: address() } });
  const bob = client.withIdentity('bob');
  const carol = client.withIdentity('carol');
  const reaches = async (c: StasisClient) => refusal(() => c.runs.get('run-no-such-run'));
  const notFound = { code: 'NOT_FOUND', message: 'run run-no-such-run not found' };
  const closed = { code: 'UNAVAILABLE', message: 'the client is closed' };
  try {
    await bob.close();
    await bob.close();
    // It closed the shared connection: the parent and every other identity were UNAVAILABLE.
    expect([await reaches(client), await reaches(carol), await reaches(bob)]).toEqual([notFound, notFound, notFound]);
    expect(client.withIdentity('bob')).toBe(bob);
  } finally {
    await client.close();
  }
  expect([await reaches(client), await reaches(carol), await reaches(bob)]).toEqual([closed, closed, closed]);
});

test('connect() to a namespace the server does not have is a StasisError (INVALID_ARGUMENT) a library caller catches, and still a ConfigError', async () => {
  const err = await StasisClient.connect({ connection: { address: address() }, namespace: 'no-such-namespace' }).catch(
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StasisError);
  expect(err).toBeInstanceOf(ConfigError);
  expect(err).toMatchObject({
    code: 'INVALID_ARGUMENT',
    httpStatus: 400,
    // Named as the caller gave it (an option), not as the environment variable it did not use.
    message: expect.stringMatching(/^namespace: "no-such-namespace" does not exist/),
  });
  // loadConfig's refusals are StasisErrors too.
  expect(() => loadConfig({ STASIS_TASK_QUEUE: 'a b' })).toThrow(StasisError);
});
