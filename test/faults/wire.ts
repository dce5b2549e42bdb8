import * as fc from 'fast-check';

// Hostile requests drawn from the wire format (JSON values and HTTP), never from
// the product's own schemas: a shape below is what the documentation says a
// request looks like, and every case breaks exactly one documented rule of it
// (so every case must be refused) while the rest of the request is valid and
// may carry odd but legal text: RTL marks, combining marks, emoji, long strings.

/** A documented shape of a JSON request. Objects are strict: an unknown field is an error. */
export type Shape =
  | { t: 'str'; good: fc.Arbitrary<string>; bad: fc.Arbitrary<string> | undefined }
  | { t: 'int'; min: number; max: number }
  | { t: 'num'; min: number; max: number }
  | { t: 'bool' }
  | { t: 'obj'; fields: Record<string, { shape: Shape; optional?: boolean }> }
  | { t: 'rec'; key: Shape & { t: 'str' }; value: Shape }
  | { t: 'arr'; item: Shape; min: number }
  | { t: 'one'; options: Shape[] }
  /** Any JSON value, nested at most MAX_DEPTH deep. */
  | { t: 'any' };

/** Deepest JSON nesting a request may carry (documented). */
export const MAX_DEPTH = 64;

// ------------------------------------------------------------------ strings

const odd = fc.constantFrom(
  '\u202etxt.exe',
  'e\u0301\u0301\u0301\u0301',
  '\u0645\u0631\u062d\u0628\u0627',
  '\u{1F469}\u200d\u{1F469}\u200d\u{1F467}',
  '\u200b',
  '\ufeffbom',
  '\u{10FFFF}',
  'Ω≈ç√',
);
/** Legal free text: any unicode (well-formed), odd scripts, or long. */
export const text = (maxLength = 40): fc.Arbitrary<string> =>
  fc.oneof(
    fc.string({ minLength: 1, maxLength, unit: 'grapheme' }),
    odd,
    fc.constantFrom('x'.repeat(Math.min(maxLength, 9_000))),
  );
/** A lone UTF-16 surrogate: JSON can carry it (`"\ud800"`), UTF-8 cannot. */
export const loneSurrogate = fc.constantFrom('\ud800', '\udfff', 'a\udc00b', '\ud83d');

const str = (good: fc.Arbitrary<string>, bad?: fc.Arbitrary<string>): Shape => ({ t: 'str', good, bad });

/** Paths no file route takes: outside the workspace, not canonical, NUL, lone surrogates, beyond NAME_MAX or PATH_MAX, through a symlink. */
export const badWorkspacePath: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(
    '',
    '/etc/passwd',
    '//etc/passwd',
    '..',
    '../x',
    'a/../../b',
    'a/..',
    'x\0y',
    '\0',
    'dir/',
    'a//b',
    './keep.txt',
    '.',
    'a/./b',
    'n'.repeat(256),
    'd/'.repeat(2_100) + 'f',
    // Not here: a path through the workspace's symlink (`hostlink/…`). Only the file activity on
    // the host can see that link, so an Update carrying it is accepted and then refused by the
    // activity (history is written); the REST fuzz sends it (badPathQuery) and file-access attacks it.
  ),
  loneSurrogate.map((s) => `f${s}.txt`),
);
/** A workspace path: relative, canonical, inside the workspace. */
export const pathShape = (good: fc.Arbitrary<string>): Shape => str(good, badWorkspacePath);

/** An identifier: letters, digits, `.`, `_`, `-`, starting with a letter or digit, up to 128. */
export const idBad = fc.constantFrom(
  '',
  '..',
  '.hidden',
  '-x',
  'a/b',
  'a b',
  'a\0b',
  'ä',
  'a\u202e',
  'r'.repeat(129),
  '%2e%2e',
  'a\nb',
);
const enumShape = (values: string[]): Shape =>
  str(
    fc.constantFrom(...values),
    fc
      .oneof(
        fc.constantFrom('', ' '),
        fc
          .constantFrom(...values)
          .chain((v) =>
            fc.constantFrom(
              v.toUpperCase() === v ? v.toLowerCase() : v.toUpperCase(),
              ` ${v}`,
              `${v} `,
              `${v}\0`,
              `${v}\u200b`,
              v.replace(/a/g, '\u0430').replace(/e/g, '\u0435').replace(/o/g, '\u043e'),
            ),
          ),
      )
      .filter((v) => !values.includes(v)),
  );
const duration = str(
  fc.constantFrom('30s', '5m', '2h', '1d'),
  fc.constantFrom('', '0s', '1.5h', '-1m', '1w', '10', 's', '1 s', '1S', '\uff11s', '1e3s', '1d1h', '01m'),
);
const envName = str(
  fc.constantFrom('A', 'FOO_BAR', '_x1'),
  fc.constantFrom('', '1A', 'A-B', 'A=B', 'A B', 'Ä', 'A\0', 'PATH\n'),
);
const nulIn = (s: string): string => `${s.slice(0, 2)}\0${s.slice(2)}`;
const command = str(
  fc.constantFrom('echo fuzz > fuzz-ran.txt', 'touch fuzz-ran.txt'),
  fc.oneof(fc.constantFrom('', 'x'.repeat(1_000_001)), fc.constantFrom('touch fuzz-ran.txt').map(nulIn)),
);
const envValue = str(text(), fc.constantFrom('a\0b', '\0'));
const envMap: Shape = { t: 'rec', key: envName as Shape & { t: 'str' }, value: envValue };
const base64 = str(
  fc.constantFrom('', 'YQ==', 'ZnV6eg=='),
  fc.constantFrom('%%%%', 'abc', 'ab=c', 'YQ==YQ==', 'YQ', ' YQ==', 'YQ==\n', 'Y Q=='),
);

// ------------------------------------------------------------------ request shapes

const obj = (fields: Record<string, Shape>, optional: string[] = []): Shape => ({
  t: 'obj',
  fields: Object.fromEntries(
    Object.entries(fields).map(([k, shape]) => [k, { shape, optional: optional.includes(k) }]),
  ),
});

export const interactionResponse: Shape = {
  t: 'one',
  options: [
    obj({ decision: enumShape(['approve', 'deny']), comment: str(text(), fc.constant('c'.repeat(10_001))) }, [
      'comment',
    ]),
    obj({ input: str(text(), undefined) }),
  ],
};
/** An Update's answer; `interactionId` names the pending interaction (any other is not found). */
export const respondInput = (interactionId: string): Shape =>
  obj(
    {
      interactionId: str(fc.constant(interactionId), fc.constant('')),
      response: interactionResponse,
      respondedBy: str(text(), fc.constantFrom('', 'b'.repeat(257))),
    },
    ['respondedBy'],
  );

export const execInput: Shape = obj({ command, timeoutMs: { t: 'int', min: 1, max: 86_400_000 }, env: envMap }, [
  'timeoutMs',
  'env',
]);
export const readFileInput = (good: fc.Arbitrary<string>): Shape => obj({ path: pathShape(good) });
export const writeFileInput = (good: fc.Arbitrary<string>): Shape =>
  obj({ path: pathShape(good), contentBase64: base64 });

const workspace: Shape = {
  t: 'one',
  options: [
    obj({ kind: enumShape(['isolated']) }),
    obj({ kind: enumShape(['active']), hostPath: str(fc.constant('/x'), fc.constantFrom('', 'rel/dir', '/tmp/a\0b')) }),
  ],
};
/** Per-sandbox limits; each one left out takes the host's default. */
const limits = obj(
  {
    processes: { t: 'int', min: 16, max: 1_000_000 },
    memoryMiB: { t: 'int', min: 64, max: 16_777_216 },
    cpus: { t: 'num', min: 0.01, max: 1024 },
    fileMiB: { t: 'int', min: 1, max: 16_777_216 },
    diskMiB: { t: 'int', min: 16, max: 16_777_216 },
  },
  ['processes', 'memoryMiB', 'cpus', 'fileMiB', 'diskMiB'],
);
const template = str(fc.constantFrom('default', 'node'), fc.constantFrom('', 't'.repeat(257)));
const provider = str(fc.constant('local'), fc.constantFrom('', 'p'.repeat(129)));

export const createSandboxInput: Shape = obj(
  {
    provider,
    template,
    env: envMap,
    workspace,
    limits,
    policy: obj({ timeout: duration, ttl: duration }, ['timeout', 'ttl']),
  },
  ['template', 'env', 'workspace', 'limits', 'policy'],
);

const wsPath = pathShape(fc.constantFrom('notes.txt', 'd/e.txt'));
const step: Shape = {
  t: 'one',
  options: [
    obj({ exec: command, background: { t: 'bool' } }, ['background']),
    obj({ ask: str(text(), fc.constant('')), kind: enumShape(['approval', 'input']) }, ['kind']),
    obj({ hold: str(text(), fc.constant('')) }),
    obj({ writeFile: obj({ path: wsPath, content: str(text(), undefined) }) }),
    obj({ expectFile: obj({ path: wsPath, content: str(text(), undefined) }) }),
    obj({ complete: { t: 'any' } }),
  ],
};
/** A RunSpec of the scripted driver; nested `spawn` specs are left to the deep-nesting cases. */
export const runSpec: Shape = obj(
  {
    runId: str(fc.constant('fuzz-never-started'), idBad),
    agent: obj({ driver: enumShape(['scripted']), steps: { t: 'arr', item: step, min: 1 } }),
    sandbox: obj({ provider, template, env: envMap, workspace, limits }, ['template', 'env', 'workspace', 'limits']),
    policy: obj(
      {
        pauseMode: enumShape(['auto', 'DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE']),
        suspendedRetentionSeconds: { t: 'int', min: 0, max: 315_360_000 },
        idleTimeout: duration,
        ttl: duration,
      },
      ['pauseMode', 'suspendedRetentionSeconds', 'idleTimeout', 'ttl'],
    ),
    labels: { t: 'rec', key: str(text(), undefined) as Shape & { t: 'str' }, value: str(text(), undefined) },
  },
  ['runId', 'policy', 'labels'],
);

// ------------------------------------------------------------------ values

const scalar = fc.oneof(
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.boolean(),
  fc.constant(null),
  text(),
);
const junk = fc.jsonValue({ maxDepth: 2 });

/** A valid value of a shape. */
export function valid(shape: Shape): fc.Arbitrary<unknown> {
  switch (shape.t) {
    case 'str':
      return shape.good;
    case 'int':
      return fc.integer({ min: shape.min, max: shape.max });
    case 'num':
      return fc.double({ min: shape.min, max: shape.max, noNaN: true });
    case 'bool':
      return fc.boolean();
    case 'any':
      return fc.jsonValue({ maxDepth: 3 });
    case 'arr':
      return fc.array(valid(shape.item), { minLength: shape.min, maxLength: shape.min + 1 });
    case 'rec':
      return fc.dictionary(valid(shape.key) as fc.Arbitrary<string>, valid(shape.value), { maxKeys: 2 });
    case 'one':
      return fc.oneof(...shape.options.map(valid));
    case 'obj': {
      const entries = Object.entries(shape.fields);
      return fc.record(Object.fromEntries(entries.map(([k, f]) => [k, valid(f.shape)])), {
        requiredKeys: entries.filter(([, f]) => !f.optional).map(([k]) => k),
      });
    }
  }
}

/** A JSON value of another type than the shape takes. */
function wrongType(shape: Shape): fc.Arbitrary<unknown> {
  const kinds: Record<string, fc.Arbitrary<unknown>> = {
    str: text(),
    num: fc.oneof(fc.integer(), fc.double({ noNaN: true, noDefaultInfinity: true })),
    bool: fc.boolean(),
    null: fc.constant(null),
    arr: fc.array(junk, { maxLength: 3 }),
    obj: fc.dictionary(fc.string({ maxLength: 8 }), junk, { maxKeys: 3 }),
  };
  const own: Record<Shape['t'], string[]> = {
    str: ['str'],
    int: ['num'],
    num: ['num'],
    bool: ['bool'],
    obj: ['obj'],
    rec: ['obj'],
    arr: ['arr'],
    one: ['obj'],
    any: Object.keys(kinds),
  };
  const others = Object.keys(kinds).filter((k) => !own[shape.t].includes(k));
  return fc.oneof(...others.map((k) => kinds[k]));
}

/** JSON nested deeper than MAX_DEPTH. */
export const tooDeep = fc
  .tuple(fc.integer({ min: MAX_DEPTH + 1, max: 20_000 }), fc.boolean())
  .map(([depth, arrays]) => {
    let value: unknown = 1;
    for (let i = 0; i < depth; i++) value = arrays ? [value] : { d: value };
    return value;
  });

/** A key no strict object takes: hostile names, and near-misses of real ones. */
const extraKey = (known: string[]) =>
  fc
    .oneof(
      fc.string({ minLength: 1, maxLength: 12 }),
      fc.constantFrom('__proto__', 'constructor', 'prototype', '', '\0', 'toString'),
      ...(known.length === 0
        ? []
        : [
            fc.constantFrom(...known).map((k) => `${k[0].toUpperCase()}${k.slice(1)}`),
            fc.constantFrom(...known).map((k) => `${k}\u200b`),
          ]),
    )
    .filter((k) => !known.includes(k));

/** Sets a field that may be named `__proto__`, as JSON.parse would (an own property). */
function withField(object: Record<string, unknown>, key: string, value: unknown): Record<string, unknown> {
  const copy = { ...object };
  Object.defineProperty(copy, key, { value, enumerable: true, writable: true, configurable: true });
  return copy;
}

/** A value of the shape that breaks exactly one documented rule somewhere inside it. */
export function invalid(shape: Shape): fc.Arbitrary<unknown> {
  // `any` takes every type: only its nesting can be wrong.
  if (shape.t === 'any') return tooDeep;
  const here: fc.Arbitrary<unknown>[] = [wrongType(shape)];
  switch (shape.t) {
    case 'str':
      if (shape.bad) here.push(shape.bad, shape.bad);
      break;
    case 'int':
      here.push(
        fc.constantFrom(shape.min - 1, shape.max + 1, 1.5, 1e21, Number.MAX_VALUE, -Number.MAX_VALUE, 2 ** 53),
        fc.oneof(fc.integer({ max: shape.min - 1 }), fc.integer({ min: shape.max + 1 })),
      );
      break;
    case 'num':
      here.push(fc.constantFrom(shape.min / 2 - 1, shape.max * 2 + 1, Number.MAX_VALUE, -Number.MAX_VALUE));
      break;
    case 'arr':
      if (shape.min > 0) here.push(fc.constant([]));
      here.push(
        fc
          .tuple(fc.array(valid(shape.item), { maxLength: 1 }), invalid(shape.item))
          .map(([items, bad]) => [...items, bad]),
      );
      break;
    case 'rec': {
      const good = valid(shape.value);
      if (shape.key.bad) here.push(fc.tuple(shape.key.bad, good).map(([k, v]) => withField({}, k, v)));
      here.push(fc.tuple(shape.key.good, invalid(shape.value)).map(([k, v]) => withField({}, k, v)));
      break;
    }
    case 'one':
      here.push(...shape.options.map(invalid));
      break;
    case 'obj': {
      const known = Object.keys(shape.fields);
      const base = valid(shape) as fc.Arbitrary<Record<string, unknown>>;
      const required = known.filter((k) => !shape.fields[k].optional);
      here.push(
        fc.tuple(base, extraKey(known), junk).map(([o, k, v]) => withField(o, k, v)),
        ...known.map((k) => fc.tuple(base, invalid(shape.fields[k].shape)).map(([o, v]) => withField(o, k, v))),
      );
      if (required.length > 0)
        here.push(
          fc.tuple(base, fc.constantFrom(...required)).map(([o, k]) => {
            const copy = { ...o };
            delete copy[k];
            return copy;
          }),
        );
      break;
    }
  }
  return fc.oneof(...here);
}

/** Arguments of an Update that takes `arity` of them, with one rule broken: a bad argument, or one too many or few. */
export function invalidArgs(shape: Shape | undefined): fc.Arbitrary<unknown[]> {
  if (!shape) return fc.array(fc.oneof(junk, scalar), { minLength: 1, maxLength: 3 });
  return fc.oneof(
    { weight: 8, arbitrary: invalid(shape).map((v) => [v]) },
    { weight: 1, arbitrary: fc.tuple(valid(shape), fc.oneof(junk, scalar)).map((a) => [...a]) },
    { weight: 1, arbitrary: fc.constant<unknown[]>([]) },
  );
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** True when a string (or key) inside carries a lone surrogate, which a UTF-8 transport (Temporal's payloads) replaces. */
export function hasLoneSurrogate(value: unknown): boolean {
  let found = false;
  JSON.stringify(value, (key: string, v: unknown) => {
    if (LONE_SURROGATE.test(key) || (typeof v === 'string' && LONE_SURROGATE.test(v))) found = true;
    return v;
  });
  return found;
}

// ------------------------------------------------------------------ HTTP bodies

export interface RawBody {
  body: string | Buffer;
  contentType: string;
}

/**
 * A JSON body that breaks a rule of HTTP or of JSON rather than of the shape:
 * a duplicated key, broken or trailing text, another content type, over the 1 MiB limit.
 */
export function badJsonText(shape: Shape): fc.Arbitrary<RawBody> {
  const json =
    (contentType = 'application/json') =>
    (body: string) => ({ body, contentType });
  const goodText = valid(shape).map((v) => JSON.stringify(v));
  return fc.oneof(
    // The same key twice: which one counts depends on the parser, so neither may.
    goodText
      .map((t) => {
        const key = /^\{("(?:[^"\\]|\\.)*")/.exec(t)?.[1];
        return key ? `{${key}:"first",${t.slice(1)}` : '{"k":1,"k":1}';
      })
      .map(json()),
    fc
      .tuple(goodText, fc.constantFrom('', '{', '{"a":', 'nul', '[1,', '{"a":1}x', '\ufeff{}', "{'a':1}", '{"a":01}'))
      .map(([t, tail]) => (tail === '' ? t.slice(0, Math.max(1, t.length - 1)) : tail))
      .map(json()),
    fc
      .tuple(
        goodText,
        fc.constantFrom(
          'text/plain',
          'application/x-www-form-urlencoded',
          'application/xml',
          'multipart/form-data; boundary=x',
          'application/json-seq',
        ),
      )
      .map(([body, contentType]) => ({ body, contentType })),
    goodText.map((t) => json()(`${t.slice(0, -1)}${t.length > 2 ? ',' : ''}"pad":"${'p'.repeat(1024 * 1024)}"}`)),
  );
}
