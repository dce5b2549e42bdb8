import * as fc from 'fast-check';
import type { z } from 'zod';
import {
  ChildStateInput,
  ExecInput,
  ReadFileInput,
  ReconcileInput,
  RespondInput,
  WriteFileInput,
} from '../../common/schemas';
import {
  childStateInputIssues,
  execInputIssues,
  readFileInputIssues,
  reconcileInputIssues,
  RESOURCE_STATES,
  respondInputIssues,
  recordedRespondInputIssues,
  RUN_STATUSES,
  writeFileInputIssues,
  type WireIssue,
} from '../../common/wire-checks';
import { CONTROL_CHARACTER } from '../../common/wire-json';

// Workflow code validates its inputs without zod (common/wire-checks). These properties hold the
// hand-written checks to the zod schemas the edges use: for any value, both accept or both reject.
// A schema that grows (a new answer shape, a new field) makes them fail until the check follows.

/**
 * Characters shown escaped to people, which a name of who acted must not hold (controls, bidi,
 * invisible ones): mixed into text, as fc.string alone seldom draws one (tags are astral).
 */
const unsafeChar = fc.constantFrom(
  ...['\u0007', '\n', '\u0085', '\u202e', '\u2067', '\u200b', '\u200d', '\u061c', '\u2060', '\ufeff'],
  ...['\u00ad', '\u180e', '\u2028', '\u2029', '\ufffa', '\u115f', '\u3164', '\u034f', '\u{e0041}', '\u{e007f}'],
  // Variation selectors no emoji takes, wherever they are (U+FE0E/U+FE0F: in the examples below).
  ...['\ufe00', '\ufe0d', '\u{e0100}', '\u{e01ef}'],
);
const text = fc.oneof(
  fc.string(),
  fc.string({ unit: 'grapheme', minLength: 1 }),
  fc.string({ unit: 'binary' }),
  fc.tuple(fc.string({ maxLength: 8 }), unsafeChar, fc.string({ maxLength: 8 })).map((parts) => parts.join('')),
  fc.constantFrom('', '\0', 'a\0b', '\ud800', 'é'.repeat(128), 'n'.repeat(255), 'n'.repeat(256), '  '),
  fc.constantFrom('alice\u200b', 'bob\u0007', 'x\udc00y'),
);
/** Values near each rule's edges: lengths, NUL, path spellings, base64 padding, number bounds. */
const edgy = fc.oneof(
  text,
  fc.constantFrom(
    'x'.repeat(257),
    'c'.repeat(10_000),
    'c'.repeat(10_001),
    '/abs',
    'a//b',
    'a/./b',
    '..',
    'a/..',
    'dir/',
    '.hidden',
    'd/'.repeat(2_048) + 'f',
    'QQ==',
    'QQ=',
    'QUJD',
    'QUJ=D',
    'Q===',
    '====',
    'approve',
    'deny',
    'ACTIVE',
    'COMPLETED',
    'PATH',
    '_X1',
    '1X',
    'A-B',
    '__proto__',
  ),
  fc.constantFrom(
    0,
    -0,
    1,
    -1,
    1.5,
    86_400_000,
    86_400_001,
    Number.MAX_SAFE_INTEGER,
    2 ** 60,
    true,
    false,
    null,
    [],
    {},
  ),
  fc.integer(),
  fc.double(),
  fc.jsonValue({ maxDepth: 2 }),
);

const workspacePath = fc.oneof(
  fc
    .array(fc.oneof(fc.stringMatching(/^[\w.-]{1,12}$/), text, fc.constantFrom('.', '..', '')), {
      minLength: 1,
      maxLength: 4,
    })
    .map((names) => names.join('/')),
  edgy,
);
const envName = fc.oneof(fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,8}$/), text);
const base64 = fc.oneof(
  fc.uint8Array({ maxLength: 40 }).map((bytes) => Buffer.from(bytes).toString('base64')),
  fc.uint8Array({ maxLength: 40 }).map((bytes) => Buffer.from(bytes).toString('base64').replace(/=+$/, '')),
  fc.stringMatching(/^[A-Za-z0-9+/=]{0,12}$/),
);

/** Records whose optional keys may each be absent. */
const record = (
  required: Record<string, fc.Arbitrary<unknown>>,
  optional: Record<string, fc.Arbitrary<unknown>> = {},
) => fc.record({ ...required, ...optional }, { requiredKeys: Object.keys(required) });

const answers = fc.oneof(
  record(
    { decision: fc.constantFrom('approve', 'deny') },
    { comment: fc.oneof(text, fc.constant('c'.repeat(10_001))) },
  ),
  record({ input: text }),
  record(
    {
      decision: fc.constant('edit'),
      action: fc.oneof(
        record(
          {},
          {
            command: fc.oneof(text, fc.constantFrom(' ', '\t\n', '\u3000', ' ls ')),
            files: fc.array(text, { maxLength: 2 }),
            diff: text,
          },
        ),
        edgy,
      ),
    },
    { comment: text },
  ),
  record({ option: text }, { comment: text }),
);
const shapes: Record<string, fc.Arbitrary<unknown>> = {
  respond: record(
    { interactionId: text, response: answers },
    { respondedBy: fc.oneof(text, fc.constantFrom('r'.repeat(256), 'r'.repeat(257))) },
  ),
  childState: record(
    { runId: text, state: fc.constantFrom(...RESOURCE_STATES) },
    { status: fc.constantFrom(...RUN_STATUSES) },
  ),
  reconcile: record({ hostId: text, alive: fc.boolean() }),
  exec: record(
    { command: text },
    {
      timeoutMs: fc.oneof(fc.integer({ min: -2, max: 86_400_002 }), fc.constant(1.5)),
      env: fc.dictionary(envName, fc.oneof(text, fc.constant('v'.repeat(32_001))), { maxKeys: 3 }),
    },
  ),
  readFile: record({ path: workspacePath }),
  writeFile: record({ path: workspacePath, contentBase64: base64 }),
};

/** A value with one place changed: a field replaced by an edge value, a field removed, or a field added. */
function mutated(valid: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc
    .tuple(
      valid,
      fc.nat(),
      edgy,
      fc.constantFrom('replace', 'remove', 'add'),
      fc.constantFrom('extra', '__proto__', 'comment', 'env', 'status'),
    )
    .map(([value, pick, replacement, how, newKey]) => {
      const copy = structuredClone(value);
      const places: Record<string, unknown>[] = [];
      const walk = (v: unknown) => {
        if (typeof v === 'object' && v !== null && !Array.isArray(v)) {
          places.push(v as Record<string, unknown>);
          Object.values(v).forEach(walk);
        }
      };
      walk(copy);
      if (places.length === 0) return replacement;
      const place = places[pick % places.length];
      const keys = Object.keys(place);
      const key = keys.length ? keys[pick % keys.length] : newKey;
      // defineProperty so that `__proto__` becomes an own key, as JSON.parse makes it.
      if (how === 'remove') delete place[key];
      else
        Object.defineProperty(place, how === 'add' ? newKey : key, {
          value: replacement,
          enumerable: true,
          writable: true,
          configurable: true,
        });
      return copy;
    });
}

const pairs: [string, z.ZodType, (v: unknown) => WireIssue[]][] = [
  ['respond', RespondInput, respondInputIssues],
  ['childState', ChildStateInput, childStateInputIssues],
  ['reconcile', ReconcileInput, reconcileInputIssues],
  ['exec', ExecInput, execInputIssues],
  ['readFile', ReadFileInput, readFileInputIssues],
  ['writeFile', WriteFileInput, writeFileInputIssues],
];

describe.each(pairs)('the %s check accepts exactly what its zod schema accepts', (name, schema, check) => {
  const agree = (value: unknown) => {
    const byZod = schema.safeParse(value).success;
    const issues = check(value);
    expect({ value, accepted: issues.length === 0 }).toEqual({ value, accepted: byZod });
    // A rejection names at least one field or the whole value, with a message.
    for (const issue of issues) expect(issue.message).not.toEqual('');
  };

  test('on arbitrary JSON', () => {
    fc.assert(fc.property(fc.jsonValue(), agree), { numRuns: 500 });
  });

  test('on generated inputs of the right shape, valid or near the edges', () => {
    const samples = fc.sample(shapes[name], 300).map((v) => schema.safeParse(v).success);
    // The generator reaches both sides of the schema, so the property below is not vacuous.
    expect(new Set(samples)).toEqual(new Set([true, false]));
    fc.assert(fc.property(shapes[name], agree), { numRuns: 2_000 });
  });

  test('on mutated inputs: one field replaced, removed or added', () => {
    fc.assert(fc.property(mutated(shapes[name]), agree), { numRuns: 2_000 });
  });

  test('after a JSON round trip, as workflow code receives it', () => {
    fc.assert(
      fc.property(fc.oneof(shapes[name], mutated(shapes[name])), (value) =>
        agree(JSON.parse(JSON.stringify(value ?? null))),
      ),
      { numRuns: 1_000 },
    );
  });
});

test('respondedBy: a name holding a control, bidi or invisible character, or a lone surrogate, is refused by both, naming respondedBy', () => {
  const named = (respondedBy: string) => ({
    interactionId: 'int-1',
    response: { decision: 'approve' },
    respondedBy,
  });
  // An emoji with the one selector it takes is a name like any other.
  for (const fine of ['alice', 'ops \u2764\ufe0f', 'team 1\ufe0f\u20e3']) {
    expect(RespondInput.safeParse(named(fine)).success).toBe(true);
    expect(respondInputIssues(named(fine))).toEqual([]);
  }
  const bad = fc.oneof(
    fc.tuple(fc.string({ maxLength: 8 }), unsafeChar, fc.string({ maxLength: 8 })).map((parts) => parts.join('')),
    fc.constantFrom('alice\u200b', 'bob\u0007', '\ud800', 'x\udc00y', 'alice\ufe0f', 'ops \u2764\ufe0f\ufe0f'),
  );
  fc.assert(
    fc.property(bad, (respondedBy) => {
      expect(RespondInput.safeParse(named(respondedBy)).success).toBe(false);
      const issues = respondInputIssues(named(respondedBy));
      expect(issues.map((issue) => issue.path)).toEqual([['respondedBy']]);
      // The Update's handler and the signal's run again on replay: a recorded name is taken as it was.
      expect(recordedRespondInputIssues(named(respondedBy))).toEqual([]);
    }),
  );
  expect(respondInputIssues(named('alice\u200b'))).toEqual([
    { path: ['respondedBy'], message: 'must not contain a control, bidi or invisible character' },
  ]);
  // The shared generator draws such names too, so the properties above cover them.
  const drawn = fc
    .sample(shapes.respond, 2_000)
    .map((v) => (v as { respondedBy?: unknown }).respondedBy)
    .filter((by) => typeof by === 'string' && by.length <= 256 && CONTROL_CHARACTER.test(by));
  expect(drawn.length).toBeGreaterThan(20);
});
