import * as fc from 'fast-check';
import { ListRunsQuery } from '../../api/schemas';
import { ChildStateInput, CreateSandboxInput, ReconcileInput, RunSpec, WorkspacePath } from '../../common/schemas';
import { duplicateKey, jsonValueProblem, MAX_JSON_DEPTH } from '../../common/wire-json';

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
  fc.assert(fc.property(fc.jsonValue({ maxDepth: 10 }), (v) => jsonValueProblem(v, 'body') === undefined));
});

test('a list limit is decimal digits only', () => {
  for (const bad of ['0x10', '1e2', ' 5', '', '1.5', '0', '1001'])
    expect({ bad, ok: ListRunsQuery.safeParse({ limit: bad }).success }).toEqual({ bad, ok: false });
  expect(ListRunsQuery.parse({ limit: '50' })).toEqual({ limit: 50 });
});
