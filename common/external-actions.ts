import { canonicalJson, sha256Hex } from './hashes';
import { ANSWER_KINDS, interactionSpecProblem, type AnswerKind } from './interactions';
import { runSpecIssues } from './run-spec-checks';
import { IDENTIFIER_MAX, IDENTIFIER_RE, isObject } from './wire-checks';
import { findJsonProblem } from './wire-json';

// The actions of an external agent (README, "Bring your own agent"), as plain
// rules without zod: the Run's workflow checks every action it is sent with
// them, and the wire schemas (common/schemas.ts) apply the same ask rules.

/** What an external agent may ask its Run to do. */
export const ACTION_TYPES = ['exec', 'writeFile', 'readFile', 'ask', 'spawn', 'complete', 'fail'] as const;
export type ActionType = (typeof ACTION_TYPES)[number];

// Its home is wire-checks.ts (run-spec-checks.ts reads it too, and this module reads that one).
export { EXTERNAL_DRIVER } from './wire-checks';

/** How long sending an action waits for it to finish before answering with it still under way. */
export const ACTION_WAIT_MS = 20_000;
/** The longest wait a caller may ask for: no request is held longer. */
export const MAX_ACTION_WAIT_MS = 60_000;

/** Limits of an action, shared by the wire schema and the workflow's check. */
export const ACTION_LIMITS = {
  command: 1_000_000,
  content: 1_000_000,
  ask: 10_000,
  title: 200,
  details: 20_000,
  diff: 1_000_000,
  options: 20,
  option: 200,
  files: 1_000,
  timeoutMs: 86_400_000,
  message: 10_000,
} as const;

/** The sha-256 of an action's canonical JSON: the same key with another body is a conflict. */
export const actionBodyHash = (action: unknown): string => sha256Hex(canonicalJson(action));

/** A problem with one field of an action: its path and what is wrong. */
export interface FieldProblem {
  path: string;
  message: string;
}

/**
 * The rules between the fields of an `ask`: 'option' in accepts needs options, 'edit'
 * needs an approval, options are distinct. Undefined when it keeps them.
 */
export function askProblem(ask: { kind?: string; options?: string[]; accepts?: string[] }): FieldProblem | undefined {
  if (ask.options && new Set(ask.options).size !== ask.options.length) {
    return { path: 'options', message: 'must be distinct' };
  }
  if (ask.accepts && new Set(ask.accepts).size !== ask.accepts.length) {
    return { path: 'accepts', message: 'must be distinct' };
  }
  const mixed = interactionSpecProblem({
    kind: ask.kind === 'input' ? 'input' : 'approval',
    ...(ask.options ? { options: ask.options } : {}),
    ...(ask.accepts ? { accepts: ask.accepts as AnswerKind[] } : {}),
  });
  return mixed && { path: mixed.field, message: mixed.message };
}

type Check = (value: unknown) => string | undefined;

const str =
  (min: number, max: number): Check =>
  (v) =>
    typeof v !== 'string'
      ? 'must be a string'
      : v.length < min
        ? 'must not be empty'
        : v.length > max
          ? `must be at most ${max} characters`
          : min > 0 && v.includes('\0')
            ? 'must not contain a NUL byte'
            : undefined;
const oneOf =
  (values: readonly string[]): Check =>
  (v) =>
    typeof v === 'string' && values.includes(v) ? undefined : `must be one of ${values.join(', ')}`;
const list =
  (item: Check, max: number): Check =>
  (v) => {
    if (!Array.isArray(v)) return 'must be an array';
    if (v.length < 1 || v.length > max) return `must have 1 to ${max} items`;
    for (const [i, x] of v.entries()) {
      const problem = item(x);
      if (problem) return `item ${i} ${problem}`;
    }
    return undefined;
  };
const anything: Check = () => undefined;
const object =
  (fields: Record<string, Check>): Check =>
  (v) => {
    if (!isObject(v)) return 'must be an object';
    const unknown = Object.keys(v).find((k) => !(k in fields));
    return unknown ? `has an unknown field ${JSON.stringify(unknown)}` : undefined;
  };

/** Each action's fields: a check, and whether it is required. */
const FIELDS: Record<ActionType, Record<string, [Check, boolean]>> = {
  exec: {
    command: [str(1, ACTION_LIMITS.command), true],
    pauseBehavior: [oneOf(['CANCEL', 'CONTINUE', 'DETACH']), false],
    executionAffinity: [oneOf(['SANDBOX', 'EXTERNAL']), false],
    timeoutMs: [
      (v) =>
        Number.isInteger(v) && (v as number) > 0 && (v as number) <= ACTION_LIMITS.timeoutMs
          ? undefined
          : `must be a whole number of milliseconds from 1 to ${ACTION_LIMITS.timeoutMs}`,
      false,
    ],
  },
  writeFile: { path: [str(1, 4095), true], content: [str(0, ACTION_LIMITS.content), true] },
  readFile: { path: [str(1, 4095), true] },
  ask: {
    ask: [str(1, ACTION_LIMITS.ask), true],
    kind: [oneOf(['approval', 'input']), false],
    title: [str(0, ACTION_LIMITS.title), false],
    details: [str(0, ACTION_LIMITS.details), false],
    action: [object({ command: anything, files: anything, diff: anything }), false],
    options: [list(str(1, ACTION_LIMITS.option), ACTION_LIMITS.options), false],
    accepts: [list(oneOf(ANSWER_KINDS), ANSWER_KINDS.length), false],
  },
  // The spec is checked in full below (runSpecIssues): the child Run is started from it.
  spawn: { spec: [(v) => (isObject(v) ? undefined : 'must be an object'), true] },
  complete: { output: [anything, false] },
  fail: { code: [str(1, 128), false], message: [str(0, ACTION_LIMITS.message), true] },
};

/** The parts of a reviewed action (an ask's `action`): each optional, of its type. */
const REVIEWED: Record<string, Check> = {
  command: (v) =>
    str(0, ACTION_LIMITS.command)(v) ?? ((v as string).includes('\0') ? 'must not contain a NUL byte' : undefined),
  files: (v) => {
    if (!Array.isArray(v)) return 'must be an array';
    if (v.length > ACTION_LIMITS.files) return `must have at most ${ACTION_LIMITS.files} items`;
    const bad = v.findIndex((f) => typeof f !== 'string' || f.length < 1 || f.length > 4096);
    return bad < 0 ? undefined : `item ${bad} must be a string of 1 to 4096 characters`;
  },
  diff: str(0, ACTION_LIMITS.diff),
};

/**
 * What is wrong with an action request `{actionId, action}`, naming the field, or
 * undefined. The workflow's own check: the client and the API also apply the
 * wire schema, which knows more (workspace paths of files, which the provider
 * checks again). A spawned RunSpec is checked in full (run-spec-checks.ts): the
 * child Run is started from it, and one missing a field it reads never started.
 */
export function actionRequestProblem(input: unknown): FieldProblem | undefined {
  if (!isObject(input)) return { path: '(root)', message: 'must be an object {actionId, action}' };
  const extra = Object.keys(input).find((k) => k !== 'actionId' && k !== 'action');
  if (extra) return { path: extra, message: 'is not a field of an action request' };
  const id = input.actionId;
  if (typeof id !== 'string' || id.length < 1 || id.length > IDENTIFIER_MAX || !IDENTIFIER_RE.test(id)) {
    return {
      path: 'actionId',
      message: `must be 1 to ${IDENTIFIER_MAX} letters, digits, ".", "_" or "-", starting with a letter or digit`,
    };
  }
  const action = input.action;
  if (!isObject(action)) return { path: 'action', message: 'must be an object with a type' };
  const type = action.type;
  if (typeof type !== 'string' || !(ACTION_TYPES as readonly string[]).includes(type)) {
    return { path: 'action.type', message: `must be one of ${ACTION_TYPES.join(', ')}` };
  }
  const fields = FIELDS[type as ActionType];
  for (const key of Object.keys(action)) {
    if (key !== 'type' && !(key in fields))
      return { path: `action.${key}`, message: `is not a field of a ${type} action` };
  }
  for (const [key, [check, required]] of Object.entries(fields)) {
    if (action[key] === undefined) {
      if (required) return { path: `action.${key}`, message: 'is required' };
      continue;
    }
    const problem = check(action[key]);
    if (problem) return { path: `action.${key}`, message: problem };
  }
  if (type === 'ask') {
    const reviewed = action.action;
    if (isObject(reviewed)) {
      for (const [key, check] of Object.entries(REVIEWED)) {
        const problem = reviewed[key] === undefined ? undefined : check(reviewed[key]);
        if (problem) return { path: `action.action.${key}`, message: problem };
      }
    }
    const rule = askProblem(action as { kind?: string; options?: string[]; accepts?: string[] });
    if (rule) return { path: `action.${rule.path}`, message: rule.message };
  }
  if (type === 'spawn') {
    const [issue] = runSpecIssues(action.spec);
    if (issue) return { path: ['action', 'spec', ...issue.path].join('.'), message: issue.message };
  }
  const json = findJsonProblem(action);
  if (json) return { path: ['action', ...json.path].join('.'), message: json.message };
  return undefined;
}
