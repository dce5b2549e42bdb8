import * as fc from 'fast-check';
import { ListRunsQuery } from '../../api/schemas';
import { ChildStateInput, CreateSandboxInput, ReconcileInput, RunSpec, WorkspacePath } from '../../common/schemas';
import { duplicateKey, jsonValueProblem, MAX_JSON_DEPTH, parseJsonText } from '../../common/wire-json';

// Regression examples of what the bad-input fuzzer (test/faults/bad-input.test.ts)
// found the wire schemas accepting, or crashing on.

const spec = (steps: unknown[]) => ({ agent: { driver: 'scripted', steps }, sandbox: { provider: 'local' } });

test('a RunSpec nested thousands of levels deep is refused, not a stack overflow', () => {
  let deep: unknown = spec([{ complete: 1 }]);
  for (let i = 0; i < 2_000; i++) deep = spec([{ spawn: deep }]);
  const parsed = RunSpec.safeParse(deep);
  expect(parsed.success).toBe(false);
  // (named inside the union of agent kinds, as the branch that came closest)
  expect(JSON.stringify(parsed.error?.issues)).toMatch(/nested deeper than 64 levels/);

  let value: unknown = 1;
  for (let i = 0; i < 20_000; i++) value = [value];
  expect(RunSpec.safeParse(spec([{ complete: value }])).success).toBe(false);
  // A few levels of spawn, and a modest output, are fine.
  expect(RunSpec.safeParse(spec([{ spawn: spec([{ spawn: spec([{ complete: [[[{ a: [1] }]]] }]) }]) }])).success).toBe(
    true,
  );
});

test('a workspace path has one spelling: relative, no "."/".."/"//"/trailing "/", no NUL or lone surrogate, within NAME_MAX and PATH_MAX', () => {
  for (const bad of [
    '',
    '/etc/passwd',
    '..',
    'a/../../b',
    'dir/',
    'a//b',
    './keep.txt',
    '.',
    'a/./b',
    'x\0y',
    'f\ud800.txt',
    'n'.repeat(256),
    'é'.repeat(128),
    'd/'.repeat(2_048) + 'f',
  ])
    expect({ bad, ok: WorkspacePath.safeParse(bad).success }).toEqual({ bad, ok: false });
  for (const good of [
    'keep.txt',
    'dir/x.txt',
    '\u202etxt.exe',
    '.hidden',
    'a..b',
    'n'.repeat(255),
    'é'.repeat(127),
    '👩‍👩‍👧',
  ])
    expect({ good, ok: WorkspacePath.safeParse(good).success }).toEqual({ good, ok: true });
});

test('an active workspace host path holds no NUL', () => {
  expect(
    CreateSandboxInput.safeParse({ provider: 'local', workspace: { kind: 'active', hostPath: '/tmp/a\0b' } }).success,
  ).toBe(false);
});

test('the internal signals take exactly their documented shape', () => {
  expect(ReconcileInput.safeParse({ hostId: 'host-a' }).success).toBe(false);
  expect(ReconcileInput.safeParse({ hostId: 'host-a', alive: 0 }).success).toBe(false);
  expect(ReconcileInput.safeParse({ hostId: 'host-a', alive: false }).success).toBe(true);
  expect(ChildStateInput.safeParse({ junk: [1] }).success).toBe(false);
  expect(ChildStateInput.safeParse({ runId: 'c', state: 'ACTIVE', extra: 1 }).success).toBe(false);
  expect(ChildStateInput.safeParse({ runId: 'c', state: 'RELEASED', status: 'COMPLETED' }).success).toBe(true);
});

test('duplicateKey finds a key given twice in one object, at any depth, however it is escaped', () => {
  expect(duplicateKey('{"decision":"deny","decision":"approve"}')).toBe('decision');
  expect(duplicateKey('{"a":{"b":1,"\\u0062":2}}')).toBe('b');
  expect(duplicateKey('[{"a":1},{"a":1}]')).toBeUndefined();
  expect(duplicateKey('{"a":"\\"a\\":","b":{"a":[{"a":0}]}}')).toBeUndefined();
  expect(duplicateKey('{"a":[1,{"x":1}],"a":2}')).toBe('a');
  // Any JSON.stringify output has none.
  fc.assert(fc.property(fc.jsonValue(), (v) => duplicateKey(JSON.stringify(v)) === undefined));
});

test('jsonValueProblem names lone surrogates and excess depth, and passes everything else', () => {
  expect(jsonValueProblem({ comment: 'a\ud800' }, 'body')).toMatch(/^body\.comment: must be well-formed Unicode/);
  expect(jsonValueProblem({ ['k\udc00']: 1 }, 'body')).toMatch(/^body: a key must be well-formed/);
  let deep: unknown = 1;
  for (let i = 0; i < MAX_JSON_DEPTH + 1; i++) deep = { d: deep };
  expect(jsonValueProblem(deep, 'body')).toMatch(/nested deeper than 64 levels/);
  // (fast-check draws the keys `__proto__`, `constructor` and `prototype` now and then: `__proto__`, and
  // `prototype` inside `constructor`, are refused, below.)
  const withoutProto = fc.jsonValue({ maxDepth: 10 }).filter((v) => !/"(__proto__|prototype)"/.test(JSON.stringify(v)));
  fc.assert(fc.property(withoutProto, (v) => jsonValueProblem(v, 'body') === undefined));
});

/** `key` as a JSON string on the wire, each character drawn as itself or as a `\uXXXX` escape. */
const spelled = (key: string) =>
  fc
    .array(fc.boolean(), { minLength: key.length, maxLength: key.length })
    .map(
      (escaped) =>
        `"${[...key].map((c, i) => (escaped[i] ? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}` : c)).join('')}"`,
    );

/** JSON text: `inner` as a member of objects nested under `keys`, each with other members around it. */
const nestedText = (keys: string[], member: string, siblings: string[]) =>
  keys.reduceRight(
    (inner, key, i) => `{${siblings[i]}${JSON.stringify(key)}:${inner}}`,
    `{${siblings[keys.length]}${member}}`,
  );

const plainKey = fc.stringMatching(/^[a-z][a-z0-9]{0,7}$/);
/** Members whose keys are never the keys above nor `__proto__`, as text ending in a comma, or none. */
const siblingsText = fc
  .dictionary(
    fc.stringMatching(/^_[a-z0-9]{0,7}$/),
    fc.jsonValue({ maxDepth: 2 }).filter((v) => !JSON.stringify(v).includes('"__proto__"')),
    {
      maxKeys: 2,
    },
  )
  .map((members) =>
    Object.entries(members)
      .map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)},`)
      .join(''),
  );

test('property: JSON text with a `__proto__` key, however it is spelled and wherever it is, is refused naming its path', () => {
  fc.assert(
    fc.property(
      fc.array(plainKey, { maxLength: 4 }),
      fc.oneof(spelled('__proto__'), fc.constant('"__proto__"')),
      fc.jsonValue({ maxDepth: 2 }),
      fc.array(siblingsText, { minLength: 5, maxLength: 5 }),
      (keys, key, value, siblings) => {
        const text = nestedText(keys, `${key}:${JSON.stringify(value)}`, siblings);
        const parsed = parseJsonText(text, 'body');
        const at = ['body', ...keys, '__proto__'].join('.');
        // Nothing may have reached a prototype on the way.
        expect(({} as Record<string, unknown>)[keys[0] ?? 'x']).toBeUndefined();
        expect(parsed).toEqual({
          problem: `${at}: the key "__proto__" is not accepted (it would set an object's prototype)`,
        });
      },
    ),
    { numRuns: 300 },
  );
});

test('property: JSON text with `constructor.prototype` is refused naming it; `constructor` alone and plain text pass', () => {
  fc.assert(
    fc.property(
      fc.array(plainKey, { maxLength: 3 }),
      spelled('constructor'),
      spelled('prototype'),
      // Without a `__proto__` or `prototype` key of its own (fast-check draws them now and then): under
      // `constructor` either is refused, which would make the harmless text below not harmless.
      fc.jsonValue({ maxDepth: 1 }).filter((v) => !/"(__proto__|prototype)"/.test(JSON.stringify(v))),
      fc.array(siblingsText, { minLength: 4, maxLength: 4 }),
      (keys, ctor, proto, value, siblings) => {
        const text = nestedText(keys, `${ctor}:{${proto}:${JSON.stringify(value)}}`, siblings);
        expect(parseJsonText(text, 'spec')).toEqual({
          problem: `${['spec', ...keys, 'constructor', 'prototype'].join('.')}: the key "prototype" inside "constructor" is not accepted (it would reach a prototype)`,
        });
        const harmless = nestedText(keys, `${ctor}:${JSON.stringify(value)}`, siblings);
        expect(parseJsonText(harmless, 'spec')).toEqual({ value: JSON.parse(harmless) });
      },
    ),
    { numRuns: 200 },
  );
});

test('parseJsonText names a byte order mark, text that is not JSON and a key twice', () => {
  expect(parseJsonText('\ufeff{}', 'spec').problem).toMatch(/^spec: starts with a byte order mark/);
  expect(parseJsonText('{"a":', 'spec').problem).toMatch(/^spec: not valid JSON \(/);
  expect(parseJsonText('{"a":{"b":1,"\\u0062":2}}', 'spec').problem).toBe(
    'spec: the key "b" appears twice in one object',
  );
  expect(parseJsonText('{"a":"\\ud800"}', 'spec').problem).toMatch(/^spec\.a: must be well-formed Unicode/);
});

test('a list limit is decimal digits only', () => {
  for (const bad of ['0x10', '1e2', ' 5', '', '1.5', '0', '1001'])
    expect({ bad, ok: ListRunsQuery.safeParse({ limit: bad }).success }).toEqual({ bad, ok: false });
  expect(ListRunsQuery.parse({ limit: '50' })).toEqual({ limit: 50 });
});
