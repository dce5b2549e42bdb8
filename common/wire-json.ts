import { UNSAFE_TEXT_PATTERN, UNSAFE_TEXT_FLAGS } from './unsafe-text';
// What every JSON request must be beyond its schema (I-JSON, RFC 7493, and a
// nesting limit): no key twice in an object (parsers disagree on which one
// counts), only well-formed Unicode (a lone surrogate cannot travel as UTF-8,
// and Temporal's payloads would silently turn it into U+FFFD), and at most
// MAX_JSON_DEPTH levels of nesting (deeper values overflow the stack of the
// recursive code that validates and serialises them). A value a library caller
// passes must also be JSON at all: no BigInt, function, symbol, NaN, Infinity
// or circular object (JSON.stringify throws on some and silently drops or nulls
// the others; a parsed request never holds one). And no key `__proto__`, nor
// a `constructor` holding a `prototype` (JSON.parse makes them own keys, harmless
// until code merges or copies them: zod's records and objects then dropped
// `__proto__` silently, and a copy by assignment would set a prototype).

/** Deepest nesting of arrays and objects a request may carry. */
export const MAX_JSON_DEPTH = 64;

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** True when a string holds a UTF-16 surrogate without its pair. */
export const hasLoneSurrogate = (s: string): boolean => LONE_SURROGATE.test(s);

/** Any character of the set shown escaped to people (common/unsafe-text.ts, its one home); not global. */
export const CONTROL_CHARACTER = new RegExp(UNSAFE_TEXT_PATTERN, UNSAFE_TEXT_FLAGS);
/** Why a name (a client identity, who answered) holding one is refused: it would read as another name. */
export const CONTROL_CHARACTER_PROBLEM = 'must not contain a control, bidi or invisible character';
/** Why a key `__proto__` is refused. */
export const PROTO_KEY_PROBLEM = 'the key "__proto__" is not accepted (it would set an object\'s prototype)';
/** Why a key `prototype` inside a key `constructor` is refused. */
export const CONSTRUCTOR_PROTOTYPE_PROBLEM =
  'the key "prototype" inside "constructor" is not accepted (it would reach a prototype)';
/** Why a string holding a lone surrogate is refused. */
export const LONE_SURROGATE_PROBLEM = 'must be well-formed Unicode (it holds a lone surrogate)';

/** Why a value that is not an array or object is not JSON (a library caller's, never a parsed one's), or undefined. */
function notJson(v: unknown): string | undefined {
  switch (typeof v) {
    case 'bigint':
      return 'must be a JSON value (a BigInt is not one: send it as a string or a number)';
    case 'function':
      return 'must be a JSON value (a function is not one)';
    case 'symbol':
      return 'must be a JSON value (a symbol is not one)';
    case 'number':
      return Number.isFinite(v) ? undefined : `must be a JSON value (${String(v)} is not one)`;
    default:
      return undefined;
  }
}

/**
 * Why an object is not one JSON carries as it is (a library caller's Date, Map, Set, class instance
 * or typed array), or undefined for an array or a plain object (of any realm: its prototype is a root
 * one, or null). JSON turned them into something else without a word: a Map or a Set into `{}` (its
 * entries lost), a Date into a string. An array holding `undefined` would hold null instead.
 */
function notPlainObject(v: object): string | undefined {
  if (Array.isArray(v)) {
    return v.includes(undefined)
      ? 'must be a JSON value (an array holding undefined is not one: JSON makes it null)'
      : undefined;
  }
  const proto: unknown = Object.getPrototypeOf(v);
  if (proto === null || Object.getPrototypeOf(proto) === null) return undefined;
  const name = (v.constructor as { name?: unknown } | undefined)?.name;
  const what = typeof name === 'string' && name !== '' ? `a ${name}` : 'an instance of a class';
  const hint = v instanceof Date || name === 'Date' ? ': send it as a string' : '';
  return `must be a JSON value (${what} is not one${hint})`;
}

/** Where a JSON value breaks a rule beyond its schema, and which rule. */
export interface JsonProblem {
  path: (string | number)[];
  message: string;
}

/**
 * What is wrong with a parsed JSON value beyond its schema, or undefined when
 * nothing is. Iterative, so any depth is measured without recursion.
 */
export function findJsonProblem(value: unknown): JsonProblem | undefined {
  const stack: Walked[] = [{ value, path: [] }];
  while (stack.length > 0) {
    const walked = stack.pop()!;
    const { value: v, path } = walked;
    if (typeof v === 'string') {
      if (hasLoneSurrogate(v)) return { path, message: LONE_SURROGATE_PROBLEM };
      continue;
    }
    const notJsonValue = notJson(v);
    if (notJsonValue) return { path, message: notJsonValue };
    if (typeof v !== 'object' || v === null) continue;
    const notPlain = notPlainObject(v);
    if (notPlain) return { path, message: notPlain };
    // A circular value is endlessly deep: it is found where it runs past the limit.
    if (path.length >= MAX_JSON_DEPTH)
      return circularAt(walked) ?? { path: path.slice(0, 2), message: `nested deeper than ${MAX_JSON_DEPTH} levels` };
    if (Array.isArray(v)) v.forEach((item, i) => stack.push({ value: item, path: [...path, i], parent: walked }));
    else
      for (const [key, item] of Object.entries(v)) {
        if (hasLoneSurrogate(key))
          return { path, message: 'a key must be well-formed Unicode (it holds a lone surrogate)' };
        if (key === '__proto__') return { path: [...path, key], message: PROTO_KEY_PROBLEM };
        if (key === 'constructor' && typeof item === 'object' && item !== null && hasOwn(item, 'prototype'))
          return { path: [...path, key, 'prototype'], message: CONSTRUCTOR_PROTOTYPE_PROBLEM };
        stack.push({ value: item, path: [...path, key], parent: walked });
      }
  }
  return undefined;
}

const hasOwn = (v: object, key: string): boolean => Object.prototype.hasOwnProperty.call(v, key);

/** A value on findJsonProblem's walk, with the one it is in. */
interface Walked {
  value: unknown;
  path: (string | number)[];
  parent?: Walked;
}

/** Where the chain of values down to `deepest` first comes back to one it is inside of, if it does. */
function circularAt(deepest: Walked): JsonProblem | undefined {
  const chain: Walked[] = [];
  for (let w: Walked | undefined = deepest; w; w = w.parent) chain.unshift(w);
  const seen = new Set<unknown>();
  for (const { value, path } of chain) {
    if (seen.has(value)) return { path, message: 'must be a JSON value (it is circular: it contains itself)' };
    seen.add(value);
  }
  return undefined;
}

/** findJsonProblem as one line naming the place, under `at` (e.g. `body.comment: ...`). */
export function jsonValueProblem(value: unknown, at: string): string | undefined {
  const problem = findJsonProblem(value);
  return problem && `${[at, ...problem.path].map(String).join('.')}: ${problem.message}`;
}

/**
 * The first key that appears twice in one object of a JSON text, or undefined.
 * The text must already have parsed (JSON.parse), so only strings and brackets matter.
 */
export function duplicateKey(text: string): string | undefined {
  // One entry per open container: the keys seen so far of an object (null for an array), and
  // whether the next string of that object is a key.
  const open: { keys: Set<string> | null; expectKey: boolean }[] = [];
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let end = i + 1;
      while (text[end] !== '"') end += text[end] === '\\' ? 2 : 1;
      const top = open[open.length - 1];
      if (top?.keys && top.expectKey) {
        const raw = text.slice(i + 1, end);
        const key = raw.includes('\\') ? (JSON.parse(text.slice(i, end + 1)) as string) : raw;
        if (top.keys.has(key)) return key;
        top.keys.add(key);
        top.expectKey = false;
      }
      i = end;
    } else if (c === '{') open.push({ keys: new Set(), expectKey: true });
    else if (c === '[') open.push({ keys: null, expectKey: false });
    else if (c === '}' || c === ']') open.pop();
    else if (c === ',' && open[open.length - 1]?.keys) open[open.length - 1].expectKey = true;
  }
  return undefined;
}

/** JSON text as a surface takes it: its value, or the one line that says what is wrong with it. */
export type ParsedJsonText = { value: unknown; problem?: undefined } | { problem: string };

/**
 * JSON text as every surface takes it (a REST body, a file the CLI reads), `at` naming it in a
 * problem (`body`, `spec`): no byte order mark, JSON (JSON.parse: a `__proto__` key becomes an own
 * key, never a prototype), no key twice in one object, then findJsonProblem (a `__proto__` key named
 * where it is). The value is returned only when nothing is wrong.
 */
export function parseJsonText(text: string, at: string): ParsedJsonText {
  // JSON text must not carry one (RFC 8259 §8.1); parsers that drop it took `\ufeff{}` as `{}`.
  if (text.charCodeAt(0) === 0xfeff)
    return { problem: `${at}: starts with a byte order mark (U+FEFF); send JSON text without one` };
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { problem: `${at}: not valid JSON (${(err as Error).message})` };
  }
  const twice = duplicateKey(text);
  if (twice !== undefined) return { problem: `${at}: the key ${JSON.stringify(twice)} appears twice in one object` };
  const problem = jsonValueProblem(value, at);
  return problem ? { problem } : { value };
}
