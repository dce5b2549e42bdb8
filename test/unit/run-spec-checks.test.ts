import fc from 'fast-check';
import { actionRequestProblem } from '../../common/external-actions';
import { runSpecIssues } from '../../common/run-spec-checks';
import { ActionRequest, RunSpec } from '../../common/schemas';

// The workflow's zod-free check of a RunSpec (common/run-spec-checks.ts) accepts exactly
// what the wire schema does: an external agent's `spawn` sent straight through Temporal
// starts a child Run from its spec, and a spec the schema refuses must not get that far.

const word = fc.stringMatching(/^[a-z][a-z0-9]{0,7}$/);
const path = fc.stringMatching(/^[a-z]{1,8}(\/[a-z]{1,8}){0,2}$/);
const duration = fc.constantFrom('30s', '5m', '2h', '1d');

const sandbox = fc.record(
  {
    provider: fc.constantFrom('local', 'bwrap'),
    template: word,
    env: fc.dictionary(fc.stringMatching(/^[A-Z_][A-Z0-9_]{0,5}$/), fc.string({ maxLength: 8 }), { maxKeys: 2 }),
    workspace: fc.oneof(
      fc.constant({ kind: 'isolated' }),
      fc.record({ kind: fc.constant('active'), hostPath: fc.constantFrom('/srv/ws', '/tmp/x') }),
    ),
    limits: fc.record(
      {
        processes: fc.integer({ min: 16, max: 4096 }),
        memoryMiB: fc.integer({ min: 64, max: 4096 }),
        cpus: fc.double({ min: 0.01, max: 8, noNaN: true }),
        fileMiB: fc.integer({ min: 1, max: 100 }),
        diskMiB: fc.integer({ min: 16, max: 4096 }),
      },
      { requiredKeys: [] },
    ),
  },
  { requiredKeys: ['provider'] },
);
const policy = fc.record(
  {
    pauseMode: fc.constantFrom('auto', 'DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'),
    suspendedRetentionSeconds: fc.integer({ min: 0, max: 86_400 }),
    idleTimeout: duration,
    ttl: duration,
  },
  { requiredKeys: [] },
);

const { spec } = fc.letrec<{ spec: unknown; step: unknown }>((tie) => ({
  step: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.record(
      {
        exec: fc.string({ minLength: 1, maxLength: 10 }),
        pauseBehavior: fc.constantFrom('CANCEL', 'CONTINUE', 'DETACH'),
        executionAffinity: fc.constantFrom('SANDBOX', 'EXTERNAL'),
        background: fc.boolean(),
      },
      { requiredKeys: ['exec'] },
    ),
    fc.record(
      {
        ask: fc.string({ minLength: 1, maxLength: 10 }),
        kind: fc.constant('approval'),
        onDeny: fc.constantFrom('fail', 'continue'),
        title: fc.string({ maxLength: 20 }),
        details: fc.string({ maxLength: 20 }),
        action: fc.record(
          { command: fc.string(), files: fc.array(path, { maxLength: 2 }), diff: fc.string() },
          { requiredKeys: [] },
        ),
        options: fc.uniqueArray(word, { minLength: 1, maxLength: 3 }),
        accepts: fc.constantFrom(['approve', 'deny'], ['approve', 'deny', 'edit']),
      },
      { requiredKeys: ['ask'] },
    ),
    fc.record({ spawn: tie('spec') }),
    fc.record({ hold: fc.string({ minLength: 1, maxLength: 10 }) }),
    fc.record({ writeFile: fc.record({ path, content: fc.string({ maxLength: 10 }) }) }),
    fc.record({ expectFile: fc.record({ path, content: fc.string({ maxLength: 10 }) }) }),
    fc.record({ complete: fc.jsonValue({ maxDepth: 2 }) }),
  ),
  spec: fc.record(
    {
      runId: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,20}$/),
      agent: fc.oneof(
        fc.constant({ driver: 'external' }),
        fc.record({ driver: fc.constant('scripted'), steps: fc.array(tie('step'), { minLength: 1, maxLength: 3 }) }),
        fc.record({ driver: word, input: fc.jsonValue({ maxDepth: 2 }) }, { requiredKeys: ['driver'] }),
      ),
      sandbox,
      policy,
      labels: fc.dictionary(word, word, { maxKeys: 3 }),
    },
    { requiredKeys: ['agent', 'sandbox'] },
  ),
}));

/** Every path to a value inside `v` (objects and arrays), the root included. */
function pathsOf(v: unknown, at: (string | number)[] = []): (string | number)[][] {
  const out = [at];
  if (Array.isArray(v)) v.forEach((x, i) => out.push(...pathsOf(x, [...at, i])));
  else if (typeof v === 'object' && v !== null)
    for (const [k, x] of Object.entries(v)) out.push(...pathsOf(x, [...at, k]));
  return out;
}

/** A copy of `v` with the value at `at` replaced (or deleted when `to` is the DELETE mark). */
const DELETE = Symbol('delete');
function replaced(v: unknown, at: (string | number)[], to: unknown): unknown {
  if (at.length === 0) return to;
  const [head, ...rest] = at;
  const copy = (Array.isArray(v) ? [...v] : { ...(v as Record<string, unknown>) }) as Record<string | number, unknown>;
  const inner = replaced(copy[head], rest, to);
  if (inner === DELETE) {
    if (Array.isArray(copy)) (copy as unknown[]).splice(head as number, 1);
    else delete copy[head];
  } else copy[head] = inner;
  return copy;
}

const junk = fc.oneof(
  fc.constant(DELETE),
  fc.constantFrom(
    '',
    'x\0y',
    '0s',
    '5 m',
    '/',
    '..',
    'scripted',
    'external',
    'auto',
    // Just outside and inside each numeric bound.
    -1,
    0,
    0.005,
    0.01,
    1,
    1.5,
    15,
    16,
    63,
    64,
    1024.5,
    315_360_001,
    16_777_217,
    1e12,
    true,
    null,
    [],
    {},
  ),
  fc.jsonValue({ maxDepth: 2 }),
  fc.string({ maxLength: 4 }),
  fc.record({ unknownField: fc.constant(1) }),
);

test('property: a RunSpec the wire schema accepts, the hand check accepts, and no other; it accepts what the schema makes of it too', () => {
  let valid = 0;
  let broken = 0;
  fc.assert(
    fc.property(spec, fc.nat(), junk, fc.boolean(), (good, pick, value, mutate) => {
      let input: unknown = good;
      if (mutate) {
        const paths = pathsOf(good);
        input = replaced(good, paths[pick % paths.length], value);
      }
      const parsed = RunSpec.safeParse(input);
      if (parsed.success) valid += 1;
      else broken += 1;
      expect({ input, hand: runSpecIssues(input) }).toEqual({
        input,
        hand: parsed.success ? [] : expect.arrayContaining([expect.anything()]),
      });
      // What the client starts a Run with (runWorkflow checks it again) is the schema's output.
      if (parsed.success)
        expect({ output: parsed.data, hand: runSpecIssues(parsed.data) }).toEqual({ output: parsed.data, hand: [] });
    }),
    { numRuns: 3000 },
  );
  // Both sides are exercised: valid specs and broken ones.
  expect(valid).toBeGreaterThan(1000);
  expect(broken).toBeGreaterThan(500);
});

test("a spawn action's spec is checked in full by the workflow, naming the field, as the wire schema does", () => {
  const spawnOf = (spec: unknown) => ({ actionId: 's', action: { type: 'spawn', spec } });
  const cases: [unknown, string][] = [
    [{}, 'action.spec.agent'],
    [{ sandbox: { provider: 'local' } }, 'action.spec.agent'],
    [{ agent: { driver: 'external' } }, 'action.spec.sandbox'],
    [{ agent: 'x', sandbox: 5 }, 'action.spec.agent'],
    [
      { agent: { driver: 'external' }, sandbox: { provider: 'local' }, policy: { ttl: 'soon' } },
      'action.spec.policy.ttl',
    ],
    [
      { agent: { driver: 'scripted', steps: [{ spawn: {} }] }, sandbox: { provider: 'local' } },
      'action.spec.agent.steps.0',
    ],
  ];
  for (const [s, field] of cases) {
    expect({ s, zod: ActionRequest.safeParse(spawnOf(s)).success }).toEqual({ s, zod: false });
    expect({ s, workflow: actionRequestProblem(spawnOf(s))?.path }).toEqual({
      s,
      workflow: expect.stringContaining(field),
    });
  }
  expect(
    actionRequestProblem(spawnOf({ agent: { driver: 'external' }, sandbox: { provider: 'local' } })),
  ).toBeUndefined();
});

test('each bounded field, just inside and just outside its bounds, is judged alike by both', () => {
  const base = { agent: { driver: 'external' }, sandbox: { provider: 'local' } };
  const fields: [(v: unknown) => unknown, unknown[]][] = [
    [(v) => ({ ...base, sandbox: { provider: 'local', limits: { cpus: v } } }), [0.005, 0.01, 1024, 1024.5]],
    [(v) => ({ ...base, sandbox: { provider: 'local', limits: { processes: v } } }), [15, 16, 16.5, 1e6, 1e6 + 1]],
    [(v) => ({ ...base, sandbox: { provider: 'local', limits: { memoryMiB: v } } }), [63, 64, 16_777_216, 16_777_217]],
    [(v) => ({ ...base, sandbox: { provider: 'local', limits: { fileMiB: v } } }), [0, 1, 16_777_217]],
    [(v) => ({ ...base, sandbox: { provider: 'local', limits: { diskMiB: v } } }), [15, 16, 16_777_217]],
    [(v) => ({ ...base, policy: { suspendedRetentionSeconds: v } }), [-1, 0, 0.5, 315_360_000, 315_360_001]],
    [(v) => ({ ...base, policy: { ttl: v } }), ['0s', '1s', '999999999d', '1000000000d', '1w']],
    [(v) => ({ ...base, sandbox: { provider: v } }), ['', 'p', 'p'.repeat(128), 'p'.repeat(129)]],
    [(v) => ({ ...base, sandbox: { provider: 'local', template: v } }), ['', 't'.repeat(256), 't'.repeat(257)]],
    [
      (v) => ({ ...base, runId: v }),
      [
        '',
        'a',
        '-a',
        'a'.repeat(128),
        'a'.repeat(129),
        'a/b',
        'sandbox-x',
        'sandbox-',
        'sandboxes',
        'Sandbox-x',
        'run-sandbox-x',
      ],
    ],
    [(v) => ({ ...base, agent: v }), [{ driver: 'external', input: 1 }, { driver: 'x', input: 1 }, { driver: '' }]],
    [
      (v) => ({ ...base, sandbox: { provider: 'local', workspace: v } }),
      [
        { kind: 'active', hostPath: 'rel' },
        { kind: 'active', hostPath: '/a\0' },
        { kind: 'isolated', hostPath: '/a' },
      ],
    ],
    [
      (v) => ({ agent: { driver: 'scripted', steps: [v] }, sandbox: { provider: 'local' } }),
      [
        { ask: 'q', accepts: ['option'] },
        { ask: 'q', options: ['a'], accepts: ['option'] },
        { ask: 'q', kind: 'input', accepts: ['edit'] },
        { ask: 'q', options: ['a', 'a'] },
        { ask: 'q', options: Array.from({ length: 21 }, (_, i) => `o${i}`) },
        { exec: 'a\0b' },
        { exec: '' },
        { writeFile: { path: '../x', content: '' } },
        { complete: undefined },
        {},
      ],
    ],
  ];
  for (const [make, values] of fields) {
    for (const v of values) {
      const input = make(v);
      expect({ input, hand: runSpecIssues(input).length === 0 }).toEqual({
        input,
        hand: RunSpec.safeParse(input).success,
      });
    }
  }
});
