import { utf8Length } from './payload-limits';
import { CONTROL_CHARACTER, CONTROL_CHARACTER_PROBLEM, hasLoneSurrogate, LONE_SURROGATE_PROBLEM } from './wire-json';

// Hand-written checks of the wire inputs that workflow code validates (update
// validators and signals). Workflow code must not load zod: every Run's V8
// context would build the schemas again (about 1 MiB of heap and tens of ms per
// Run). These accept and reject exactly what the zod schemas in common/schemas
// do (test/unit/wire-checks.test.ts holds them to that); the rules both share
// (path spelling, state names) live here once.

/** One problem with an input: where, and what is wrong. */
export interface WireIssue {
  path: (string | number)[];
  message: string;
}

/**
 * Standalone sandboxes' workflow ids are `sandbox-<sandboxId>`; Runs and sandboxes share the namespace's
 * ids, so no Run id may start so (a Run `sandbox-x` would take sandbox x's id, and its routes the Run's).
 */
export const SANDBOX_WORKFLOW_PREFIX = 'sandbox-';
export const RUN_ID_PREFIX_PROBLEM = `must not start with "${SANDBOX_WORKFLOW_PREFIX}" (the workflow ids of standalone sandboxes)`;

/** Webhook deliveries' workflow ids are `webhook-<deliveryId>` (workflows/webhook-delivery.ts). */
export const WEBHOOK_WORKFLOW_PREFIX = 'webhook-';
/** An unnamed child Run's id is `<parentRunId>.child-<n>` (workflows/definitions.ts plainChildRunId). */
export const CHILD_RUN_MARK = '.child-';
const CHILD_RUN_ID_END = new RegExp(`${CHILD_RUN_MARK.replace('.', '\\.')}[0-9]+$`);
/**
 * Why a caller may not choose an id Stasis gives its own workflows: started first, it took the id from
 * them (a delivery's start failed and its notification was lost; a child's spawn failed). Only ids a
 * caller chooses are refused (NewRunId at the client and the API); Runs that have such ids are read as any.
 */
export function reservedRunIdProblem(id: string): string | undefined {
  if (id.startsWith(WEBHOOK_WORKFLOW_PREFIX))
    return `must not start with "${WEBHOOK_WORKFLOW_PREFIX}" (the workflow ids of webhook deliveries)`;
  if (CHILD_RUN_ID_END.test(id))
    return `must not end with "${CHILD_RUN_MARK}<n>" (the ids Stasis gives the Runs a Run spawns unnamed)`;
  return undefined;
}

/** An id a caller may choose (a Run's, an action's): up to IDENTIFIER_MAX of these, starting with a letter or digit. */
export const IDENTIFIER_RE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
export const IDENTIFIER_MAX = 128;

/** A Run's sandbox id is its Run id and this: `<runId>-sbx`. */
export const RUN_SANDBOX_SUFFIX = '-sbx';
/**
 * A new Run's id leaves room for its sandbox's id (an identifier of at most IDENTIFIER_MAX too): a
 * longer one was started, then failed provisioning its sandbox.
 */
export const RUN_ID_MAX = IDENTIFIER_MAX - RUN_SANDBOX_SUFFIX.length;
export const RUN_ID_MAX_PROBLEM = `must be at most ${RUN_ID_MAX} characters (its sandbox's id adds "${RUN_SANDBOX_SUFFIX}")`;
export const IDENTIFIER_PROBLEM = 'must be letters, digits, ".", "_" or "-"';

/** Longest name of who acted: an answer's `respondedBy`, a client's Temporal identity. */
export const ACTOR_MAX = 256;

/** The driver whose agent is a program outside the worker, acting through the `act` Update. */
export const EXTERNAL_DRIVER = 'external';

/** The states of an execution-resource record. */
export const RESOURCE_STATES = [
  'PROVISIONING',
  'ACTIVE',
  'RELEASING',
  'RELEASE_BLOCKED',
  'RETAINED',
  'RELEASED',
  'RESTORING',
  'DESTROYING',
  'DESTROYED',
] as const;

/** The statuses of a Run. */
export const RUN_STATUSES = ['RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'CANCELLED', 'EXPIRED'] as const;

/** Longest file name, and longest path, a Linux file system takes (bytes of UTF-8). */
const NAME_MAX_BYTES = 255;
const PATH_MAX_BYTES = 4095;

/**
 * What is wrong with a path inside the sandbox workspace, if anything. One spelling only: relative,
 * names separated by single `/`, no `.` or `..` name, no trailing `/`, no NUL, well-formed Unicode
 * (so it means the same file on every hop), within the file system's limits.
 */
export function workspacePathProblem(p: string): string | undefined {
  const names = p.split('/');
  const problem = p.startsWith('/')
    ? 'must be relative to the workspace'
    : names.includes('..')
      ? 'must not contain ".."'
      : names.includes('.') || names.includes('')
        ? 'must not contain "." names, "//" or a trailing "/"'
        : p.includes('\0') || hasLoneSurrogate(p)
          ? 'must not contain NUL or a lone surrogate'
          : utf8Length(p) > PATH_MAX_BYTES || names.some((n) => utf8Length(n) > NAME_MAX_BYTES)
            ? `must be at most ${PATH_MAX_BYTES} bytes, each name at most ${NAME_MAX_BYTES}`
            : undefined;
  return problem && `${problem} (a relative path inside the workspace)`;
}

// ---------------------------------------------------------------- building blocks

export type Path = (string | number)[];
/** Checks a value at a path, adding what is wrong to issues. */
export type Check = (value: unknown, path: Path, issues: WireIssue[]) => void;

/** A JSON object: not null, not an array. */
export const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

export function text(opts: {
  min?: number;
  max?: number;
  noNul?: boolean;
  pattern?: RegExp;
  patternMessage?: string;
}): Check {
  return (v, path, issues) => {
    if (typeof v !== 'string') return void issues.push({ path, message: 'must be a string' });
    if (opts.min !== undefined && v.length < opts.min)
      issues.push({ path, message: `must be at least ${opts.min} characters` });
    if (opts.max !== undefined && v.length > opts.max)
      issues.push({ path, message: `must be at most ${opts.max} characters` });
    if (opts.noNul && v.includes('\0')) issues.push({ path, message: 'must not contain a NUL byte' });
    if (opts.pattern && !opts.pattern.test(v))
      issues.push({ path, message: opts.patternMessage ?? 'has the wrong form' });
  };
}

export function oneOf(values: readonly string[]): Check {
  return (v, path, issues) => {
    if (typeof v !== 'string' || !values.includes(v))
      issues.push({ path, message: `must be one of ${values.join(', ')}` });
  };
}

export const bool: Check = (v, path, issues) => {
  if (typeof v !== 'boolean') issues.push({ path, message: 'must be a boolean' });
};

/** An object with exactly these keys (those named in `optional` may be left out or undefined). */
export function strictObject(shape: Record<string, Check>, optional: readonly string[] = []): Check {
  return (v, path, issues) => {
    if (!isObject(v)) return void issues.push({ path, message: 'must be an object' });
    for (const [key, check] of Object.entries(shape)) {
      const value = Object.prototype.hasOwnProperty.call(v, key) ? v[key] : undefined;
      if (value === undefined && optional.includes(key)) continue;
      if (value === undefined) issues.push({ path: [...path, key], message: 'is required' });
      else check(value, [...path, key], issues);
    }
    const unknown = Object.keys(v).filter((k) => !Object.prototype.hasOwnProperty.call(shape, k));
    if (unknown.length)
      issues.push({ path, message: `unknown field(s) ${unknown.map((k) => JSON.stringify(k)).join(', ')}` });
  };
}

export function firstOf(...checks: Check[]): Check {
  return (v, path, issues) => {
    const tries = checks.map((check) => {
      const found: WireIssue[] = [];
      check(v, path, found);
      return found;
    });
    if (tries.some((t) => t.length === 0)) return;
    // The closest shape (fewest issues) names what is wrong.
    issues.push(...tries.reduce((a, b) => (b.length < a.length ? b : a)));
  };
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Environment variables for a process: names of letters, digits and `_`, values without NUL. */
export const envMap: Check = (v, path, issues) => {
  if (!isObject(v) || !isPlainObject(v)) return void issues.push({ path, message: 'must be an object of variables' });
  for (const key of Object.keys(v)) {
    // zod's record skips the key `__proto__` (it would replace the prototype of its copy).
    if (key === '__proto__') continue;
    if (!ENV_NAME.test(key)) issues.push({ path: [...path, key], message: 'must be an environment variable name' });
    // The kernel takes at most 128 KiB per environment string; 32,000 characters stay below it in any encoding.
    text({ max: 32_000, noNul: true })(v[key], [...path, key], issues);
  }
};

/** An object literal's kind of object, from any realm (payloads are decoded in the workflow's own context). */
function isPlainObject(v: object): boolean {
  const ctor: unknown = (v as { constructor?: unknown }).constructor;
  if (typeof ctor !== 'function') return true;
  const proto: unknown = ctor.prototype;
  return isObject(proto) && Object.prototype.hasOwnProperty.call(proto, 'isPrototypeOf');
}

export const workspacePath: Check = (v, path, issues) => {
  if (typeof v !== 'string') return void issues.push({ path, message: 'must be a string' });
  const problem = workspacePathProblem(v);
  if (problem) issues.push({ path, message: problem });
};

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
const base64: Check = (v, path, issues) => {
  if (typeof v !== 'string') return void issues.push({ path, message: 'must be a string' });
  if (!BASE64.test(v)) issues.push({ path, message: 'must be base64' });
  else if (v.length % 4 !== 0) issues.push({ path, message: 'must be base64 (padded to a multiple of 4 characters)' });
};

/** Longest an exec may run before the provider stops it: one day. */
const EXEC_TIMEOUT_MAX_MS = 86_400_000;
const timeoutMs: Check = (v, path, issues) => {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v <= 0 || v > EXEC_TIMEOUT_MAX_MS) {
    issues.push({ path, message: `must be a whole number of milliseconds from 1 to ${EXEC_TIMEOUT_MAX_MS}` });
  }
};

// ---------------------------------------------------------------- the inputs

const approvalResponse = strictObject({ decision: oneOf(['approve', 'deny']), comment: text({ max: 10_000 }) }, [
  'comment',
]);
const inputResponse = strictObject({ input: text({ max: 1_000_000 }) });
/** A list of at most `max` items, each checked. */
export function listOf(item: Check, max: number): Check {
  return (v, path, issues) => {
    if (!Array.isArray(v)) return void issues.push({ path, message: 'must be an array' });
    if (v.length > max) issues.push({ path, message: `must have at most ${max} items` });
    v.forEach((x, i) => item(x, [...path, i], issues));
  };
}
/** An edited command that is empty or only white space would run nothing, or fail the Run's next step. */
export const BLANK_COMMAND = 'must not be empty or only white space';
/** The action under review, as an approver edited it (ReviewedAction); at least one field. */
export const reviewedAction = strictObject(
  {
    command: text({ max: 1_000_000, noNul: true }),
    files: listOf(text({ min: 1, max: 4096 }), 1000),
    diff: text({ max: 1_000_000 }),
  },
  ['command', 'files', 'diff'],
);
const editedAction: Check = (v, path, issues) => {
  reviewedAction(v, path, issues);
  const a = isObject(v) ? v : {};
  if (isObject(v) && a.command === undefined && a.files === undefined && a.diff === undefined)
    issues.push({ path, message: 'must change at least one of command, files, diff' });
  if (typeof a.command === 'string' && a.command.trim() === '')
    issues.push({ path: [...path, 'command'], message: BLANK_COMMAND });
};
const editResponse = strictObject({ decision: oneOf(['edit']), action: editedAction, comment: text({ max: 10_000 }) }, [
  'comment',
]);
const optionResponse = strictObject({ option: text({ min: 1, max: 200 }), comment: text({ max: 10_000 }) }, [
  'comment',
]);

/**
 * A name of who acted (schemas.ts ActorName): 1-ACTOR_MAX characters, none of those shown escaped to
 * people (a control, bidi or invisible character: `alice\u200b` would read as `alice`), well-formed.
 */
const actor: Check = (v, path, issues) => {
  text({ min: 1, max: ACTOR_MAX })(v, path, issues);
  if (typeof v !== 'string') return;
  if (CONTROL_CHARACTER.test(v)) issues.push({ path, message: CONTROL_CHARACTER_PROBLEM });
  if (hasLoneSurrogate(v)) issues.push({ path, message: LONE_SURROGATE_PROBLEM });
};
const respondFields = (respondedBy: Check): Check =>
  strictObject(
    {
      interactionId: text({ min: 1 }),
      response: firstOf(approvalResponse, editResponse, inputResponse, optionResponse),
      respondedBy,
    },
    ['respondedBy'],
  );
const childStateInput = strictObject(
  { runId: text({ min: 1 }), state: oneOf(RESOURCE_STATES), status: oneOf(RUN_STATUSES) },
  ['status'],
);
const reconcileInput = strictObject({ hostId: text({ min: 1 }), alive: bool });
const execInput = strictObject({ command: text({ min: 1, max: 1_000_000, noNul: true }), timeoutMs, env: envMap }, [
  'timeoutMs',
  'env',
]);
const readFileInput = strictObject({ path: workspacePath });
const writeFileInput = strictObject({ path: workspacePath, contentBase64: base64 });

const run =
  (check: Check) =>
  (value: unknown): WireIssue[] => {
    const issues: WireIssue[] = [];
    check(value, [], issues);
    return issues;
  };

/** The respond Update of a Run: an answer to one interaction. */
export const respondInputIssues = run(respondFields(actor));
/**
 * respondInputIssues, but `respondedBy` held to its length only, as before names were held to
 * `actor`: for the Run's code that runs again on replay (the respond Update's handler, the
 * respondSignal signal; an Update's validator does not), so an answer recorded with such a name is
 * taken again as it was. The client refuses one before signalling (RespondInput), and every surface
 * shows it escaped.
 */
export const recordedRespondInputIssues = run(respondFields(text({ min: 1, max: ACTOR_MAX })));
/** The childState signal: a child Run reports its record state (and status) to its parent. */
export const childStateInputIssues = run(childStateInput);
/** The reconcile signal of a standalone sandbox. */
export const reconcileInputIssues = run(reconcileInput);
/** The exec Update of a standalone sandbox. */
export const execInputIssues = run(execInput);
/** The readFile Update of a standalone sandbox. */
export const readFileInputIssues = run(readFileInput);
/** The writeFile Update of a standalone sandbox. */
export const writeFileInputIssues = run(writeFileInput);
