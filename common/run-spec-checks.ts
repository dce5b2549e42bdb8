import { DURATION_PROBLEM, DURATION_RE } from './duration';
import { ANSWER_KINDS, interactionSpecProblem, type AnswerKind } from './interactions';
import {
  bool,
  envMap,
  EXTERNAL_DRIVER,
  IDENTIFIER_PROBLEM,
  IDENTIFIER_RE,
  RUN_ID_MAX,
  firstOf,
  isObject,
  oneOf,
  reviewedAction,
  RUN_ID_PREFIX_PROBLEM,
  SANDBOX_WORKFLOW_PREFIX,
  strictObject,
  text,
  workspacePath,
  type Check,
  type WireIssue,
} from './wire-checks';
import { findJsonProblem, hasLoneSurrogate } from './wire-json';

// A RunSpec checked by hand, for workflow code (no zod there, see wire-checks.ts):
// an external agent's `spawn` sent straight through Temporal starts a child Run
// from its spec, and a child whose spec lacks a field it reads (`sandbox`,
// `agent.driver`, a duration) failed its first workflow task again and again:
// a Run stuck RUNNING that no cancel reaches, and a parent that never completes.
// It accepts exactly what RunSpec in common/schemas.ts does (test/unit/run-spec-checks.test.ts).

const duration = text({ pattern: DURATION_RE, patternMessage: DURATION_PROBLEM });

function num(opts: { int?: boolean; min: number; max: number }): Check {
  return (v, path, issues) => {
    const ok =
      typeof v === 'number' &&
      Number.isFinite(v) &&
      (!opts.int || Number.isSafeInteger(v)) &&
      v >= opts.min &&
      v <= opts.max;
    if (!ok)
      issues.push({ path, message: `must be a ${opts.int ? 'whole ' : ''}number from ${opts.min} to ${opts.max}` });
  };
}

/** Where `check` holds, and `refine` finds nothing more (run only on a value that passed). */
const refined =
  (check: Check, refine: (v: Record<string, unknown>) => WireIssue | undefined): Check =>
  (v, path, issues) => {
    const found: WireIssue[] = [];
    check(v, path, found);
    if (found.length) return void issues.push(...found);
    const more = refine(v as Record<string, unknown>);
    if (more) issues.push({ path: [...path, ...more.path], message: more.message });
  };

const distinct =
  (item: Check, min: number, max: number): Check =>
  (v, path, issues) => {
    if (!Array.isArray(v)) return void issues.push({ path, message: 'must be an array' });
    if (v.length < min) issues.push({ path, message: `must have at least ${min} item(s)` });
    if (v.length > max) issues.push({ path, message: `must have at most ${max} items` });
    v.forEach((x, i) => item(x, [...path, i], issues));
    if (new Set(v).size !== v.length) issues.push({ path, message: 'must be distinct' });
  };

/** A JSON value within the depth limit and without lone surrogates (schemas.ts, `shallow`). */
const shallowValue: Check = (v, path, issues) => {
  const problem = findJsonProblem(v);
  if (problem) issues.push({ path: [...path, ...problem.path], message: problem.message });
};
/** `check`, on a value that is shallow enough to walk. */
const shallow =
  (check: Check): Check =>
  (v, path, issues) => {
    const before = issues.length;
    shallowValue(v, path, issues);
    if (issues.length === before) check(v, path, issues);
  };

const workspace: Check = (v, path, issues) => {
  if (!isObject(v)) return void issues.push({ path, message: 'must be an object' });
  if (v.kind === 'isolated') return strictObject({ kind: oneOf(['isolated']) })(v, path, issues);
  if (v.kind !== 'active') return void issues.push({ path: [...path, 'kind'], message: 'must be isolated or active' });
  strictObject({
    kind: oneOf(['active']),
    hostPath: (p, at, found) => {
      if (typeof p !== 'string') return void found.push({ path: at, message: 'must be a string' });
      if (!p.startsWith('/')) found.push({ path: at, message: 'must be an absolute path' });
      if (p.includes('\0') || hasLoneSurrogate(p))
        found.push({ path: at, message: 'must not contain NUL or a lone surrogate' });
    },
  })(v, path, issues);
};

const limits = strictObject(
  {
    processes: num({ int: true, min: 16, max: 1_000_000 }),
    memoryMiB: num({ int: true, min: 64, max: 16_777_216 }),
    cpus: num({ min: 0.01, max: 1024 }),
    fileMiB: num({ int: true, min: 1, max: 16_777_216 }),
    diskMiB: num({ int: true, min: 16, max: 16_777_216 }),
  },
  ['processes', 'memoryMiB', 'cpus', 'fileMiB', 'diskMiB'],
);

const sandboxSpec = strictObject(
  {
    provider: text({ min: 1, max: 128 }),
    template: text({ min: 1, max: 256 }),
    env: envMap,
    workspace,
    limits,
  },
  ['template', 'env', 'workspace', 'limits'],
);

const policy = strictObject(
  {
    pauseMode: oneOf(['auto', 'DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE']),
    suspendedRetentionSeconds: num({ int: true, min: 0, max: 315_360_000 }),
    idleTimeout: duration,
    ttl: duration,
  },
  ['pauseMode', 'suspendedRetentionSeconds', 'idleTimeout', 'ttl'],
);

/** A record of strings (zod's record skips the key `__proto__`, as envMap does). */
const stringRecord: Check = (v, path, issues) => {
  if (!isObject(v)) return void issues.push({ path, message: 'must be an object of strings' });
  for (const key of Object.keys(v)) if (key !== '__proto__') text({})(v[key], [...path, key], issues);
};

const askStep = refined(
  strictObject(
    {
      ask: text({ min: 1 }),
      kind: oneOf(['approval', 'input']),
      onDeny: oneOf(['fail', 'continue']),
      title: text({ max: 200 }),
      details: text({ max: 20_000 }),
      action: reviewedAction,
      options: distinct(text({ min: 1, max: 200 }), 1, 20),
      accepts: distinct(oneOf(ANSWER_KINDS), 1, Infinity),
    },
    ['kind', 'onDeny', 'title', 'details', 'action', 'options', 'accepts'],
  ),
  (v) => {
    const problem = interactionSpecProblem(
      v as { kind?: 'approval' | 'input'; options?: string[]; accepts?: AnswerKind[] },
    );
    return problem && { path: [problem.field], message: problem.message };
  },
);

const fileStep = (key: string): Check =>
  strictObject({ [key]: strictObject({ path: workspacePath, content: text({}) }) });

/** `{complete: anything}`: the key must be there, whatever its value. */
const completeStep: Check = (v, path, issues) => {
  if (!isObject(v)) return void issues.push({ path, message: 'must be an object' });
  if (!Object.prototype.hasOwnProperty.call(v, 'complete'))
    issues.push({ path: [...path, 'complete'], message: 'is required' });
  const unknown = Object.keys(v).filter((k) => k !== 'complete');
  if (unknown.length)
    issues.push({ path, message: `unknown field(s) ${unknown.map((k) => JSON.stringify(k)).join(', ')}` });
};

const step: Check = (v, path, issues) =>
  firstOf(
    strictObject(
      {
        exec: text({ min: 1, noNul: true }),
        pauseBehavior: oneOf(['CANCEL', 'CONTINUE', 'DETACH']),
        executionAffinity: oneOf(['SANDBOX', 'EXTERNAL']),
        background: bool,
      },
      ['pauseBehavior', 'executionAffinity', 'background'],
    ),
    askStep,
    strictObject({ spawn: runSpec }),
    strictObject({ hold: text({ min: 1 }) }),
    fileStep('writeFile'),
    fileStep('expectFile'),
    completeStep,
  )(v, path, issues);

const agent: Check = (v, path, issues) => {
  if (!isObject(v)) return void issues.push({ path, message: 'must be an object' });
  if (v.driver === 'scripted') {
    return strictObject({
      driver: oneOf(['scripted']),
      steps: (s, at, found) => {
        if (!Array.isArray(s)) return void found.push({ path: at, message: 'must be an array' });
        if (s.length < 1) found.push({ path: at, message: 'must have at least 1 item(s)' });
        s.forEach((x, i) => shallow(step)(x, [...at, i], found));
      },
    })(v, path, issues);
  }
  if (v.driver === EXTERNAL_DRIVER) return strictObject({ driver: oneOf([EXTERNAL_DRIVER]) })(v, path, issues);
  strictObject({ driver: text({ min: 1 }), input: shallowValue }, ['input'])(v, path, issues);
};

/** An identifier with room for its sandbox's id that is not a standalone sandbox's workflow id. */
const runId = refined(
  text({ min: 1, max: RUN_ID_MAX, pattern: IDENTIFIER_RE, patternMessage: IDENTIFIER_PROBLEM }),
  (v) => (String(v).startsWith(SANDBOX_WORKFLOW_PREFIX) ? { path: [], message: RUN_ID_PREFIX_PROBLEM } : undefined),
);

function runSpec(v: unknown, path: (string | number)[], issues: WireIssue[]): void {
  strictObject({ runId, agent, sandbox: sandboxSpec, policy, labels: stringRecord }, ['runId', 'policy', 'labels'])(
    v,
    path,
    issues,
  );
}

/** What is wrong with a RunSpec (each issue with its path), or nothing. */
export function runSpecIssues(value: unknown): WireIssue[] {
  const issues: WireIssue[] = [];
  // Walked only when shallow enough: a spec a few hundred spawns deep would overflow the stack.
  shallow(runSpec)(value, [], issues);
  return issues;
}
