import { z } from 'zod';
import { DURATION_PROBLEM, DURATION_RE } from './duration';
import {
  ACTOR_MAX,
  BLANK_COMMAND,
  EXTERNAL_DRIVER,
  IDENTIFIER_PROBLEM,
  IDENTIFIER_MAX,
  IDENTIFIER_RE,
  RUN_ID_MAX,
  RUN_ID_MAX_PROBLEM,
  RESOURCE_STATES,
  RUN_ID_PREFIX_PROBLEM,
  RUN_STATUSES,
  SANDBOX_WORKFLOW_PREFIX,
  reservedRunIdProblem,
  workspacePathProblem,
} from './wire-checks';
import {
  CONTROL_CHARACTER,
  CONTROL_CHARACTER_PROBLEM,
  findJsonProblem,
  hasLoneSurrogate,
  LONE_SURROGATE_PROBLEM,
} from './wire-json';
import { ANSWER_KINDS, interactionSpecProblem } from './interactions';
import { ACTION_LIMITS, askProblem, MAX_ACTION_WAIT_MS } from './external-actions';
import { labelKeywords, LABELS_MAX_CHARS } from './labels';

// The wire types (docs/DESIGN.md). Every surface (client, API,
// workflows, providers) takes its types from here with z.infer.

export const Identifier = z.string().min(1).max(IDENTIFIER_MAX).regex(IDENTIFIER_RE, IDENTIFIER_PROBLEM);
/** A Run id: an identifier that is not a standalone sandbox's workflow id. */
export const RunId = Identifier.refine((id) => !id.startsWith(SANDBOX_WORKFLOW_PREFIX), RUN_ID_PREFIX_PROBLEM);
/** The id of a Run to start: a Run id with room for its sandbox's id. */
export const NewRunId = z
  .string()
  .min(1)
  .max(RUN_ID_MAX, RUN_ID_MAX_PROBLEM)
  .regex(IDENTIFIER_RE, IDENTIFIER_PROBLEM)
  .refine((id) => !id.startsWith(SANDBOX_WORKFLOW_PREFIX), RUN_ID_PREFIX_PROBLEM)
  .superRefine((id, ctx) => {
    const problem = reservedRunIdProblem(id);
    if (problem) ctx.addIssue({ code: z.ZodIssueCode.custom, message: problem });
  });

export const Duration = z.string().regex(DURATION_RE, DURATION_PROBLEM);

export const PauseMode = z.enum(['DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE']);
export type PauseMode = z.infer<typeof PauseMode>;

export const PauseBehavior = z.enum(['CANCEL', 'CONTINUE', 'DETACH']);
export const ExecutionAffinity = z.enum(['SANDBOX', 'EXTERNAL']);

/** A string that reaches a process (argv, environment, script): a NUL byte would end it early or fail the start. */
export const ProcessText = z.string().refine((s) => !s.includes('\0'), 'must not contain a NUL byte');

/** A shell command run in a sandbox. */
export const ShellCommand = ProcessText.min(1);

export const EnvMap = z.record(
  z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name'),
  // The kernel takes at most 128 KiB per environment string; 32,000 characters stay below it in any encoding.
  ProcessText.max(32_000),
);

export const Workspace = z.discriminatedUnion('kind', [
  z.object({ kind: z.literal('isolated') }).strict(),
  z
    .object({
      kind: z.literal('active'),
      hostPath: z
        .string()
        .startsWith('/', 'must be an absolute path')
        .refine((p) => !p.includes('\0') && !hasLoneSurrogate(p), {
          message: 'must not contain NUL or a lone surrogate',
        }),
    })
    .strict(),
]);
export type Workspace = z.infer<typeof Workspace>;

export const SandboxTemplate = z.string().min(1).max(256);

/** A provider's name; it is also a search attribute value, which Temporal keeps short. */
export const ProviderName = z.string().min(1).max(128);

export const RunPolicy = z
  .object({
    pauseMode: z.enum(['auto', 'DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE']).optional(),
    // Ten years at most: a retention timer beyond what Temporal can represent fails the Run.
    suspendedRetentionSeconds: z.number().int().min(0).max(315_360_000).optional(),
    idleTimeout: Duration.optional(),
    ttl: Duration.optional(),
  })
  .strict();
export type RunPolicy = z.infer<typeof RunPolicy>;

/**
 * A path inside the sandbox workspace, in one spelling only: relative, names
 * separated by single `/`, no `.` or `..` name, no trailing `/`, no NUL, well-formed
 * Unicode (so it means the same file on every hop), within the file system's limits.
 */
export const WorkspacePath = z
  .string()
  .min(1)
  .superRefine((p, ctx) => {
    const problem = workspacePathProblem(p);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  });

/**
 * A value nested at most MAX_JSON_DEPTH levels (and well-formed Unicode), checked before anything
 * recursive walks it: a spec a few hundred `spawn` levels deep overflows the validator's stack, and
 * a value a few thousand levels deep the payload converter's (a 500 either way). A value too deep
 * is not walked at all (`standIn`, valid, takes its place) and its issue does not abort, so the
 * union of agent kinds still names it as the closest.
 */
const shallow = <S extends z.ZodType>(schema: S, standIn: z.input<S>) =>
  z.preprocess((value, ctx) => {
    const problem = findJsonProblem(value);
    if (!problem) return value;
    ctx.addIssue({ code: 'custom', message: problem.message, path: problem.path.map(String), continue: true });
    return standIn;
  }, schema);

export const ExecStep = z
  .object({
    exec: ShellCommand,
    pauseBehavior: PauseBehavior.optional(),
    executionAffinity: ExecutionAffinity.optional(),
    background: z.boolean().optional(),
  })
  .strict();
/** The action a person is asked to approve: the command, the files it touches, a diff. */
export const ReviewedAction = z
  .object({
    command: ProcessText.max(1_000_000).optional(),
    files: z.array(z.string().min(1).max(4096)).max(1000).optional(),
    diff: z.string().max(1_000_000).optional(),
  })
  .strict();
export type ReviewedAction = z.infer<typeof ReviewedAction>;

export const AnswerKind = z.enum(ANSWER_KINDS);

/** The choices of an interaction: 1..20 distinct, non-empty, at most 200 characters each. */
export const InteractionOptions = z
  .array(z.string().min(1).max(200))
  .min(1)
  .max(20)
  .refine((o) => new Set(o).size === o.length, 'must be distinct');

/** What an approver sees and may answer, besides the question (README, "Approvals"). */
export const InteractionFields = {
  title: z.string().max(200).optional(),
  details: z.string().max(20_000).optional(),
  action: ReviewedAction.optional(),
  options: InteractionOptions.optional(),
  accepts: z
    .array(AnswerKind)
    .min(1)
    .refine((a) => new Set(a).size === a.length, 'must be distinct')
    .optional(),
};

/** The cross-field rules of an interaction, as a zod check naming the field. */
export const checkInteractionSpec = (
  spec: { kind?: 'approval' | 'input'; options?: string[]; accepts?: z.infer<typeof AnswerKind>[] },
  ctx: z.RefinementCtx,
): void => {
  const problem = interactionSpecProblem(spec);
  if (problem) ctx.addIssue({ code: 'custom', message: problem.message, path: [problem.field] });
};

export const AskStep = z
  .object({
    ask: z.string().min(1),
    kind: z.enum(['approval', 'input']).optional(),
    onDeny: z.enum(['fail', 'continue']).optional(),
    ...InteractionFields,
  })
  .strict()
  .superRefine(checkInteractionSpec);
export const HoldStep = z.object({ hold: z.string().min(1) }).strict();
export const WriteFileStep = z
  .object({ writeFile: z.object({ path: WorkspacePath, content: z.string() }).strict() })
  .strict();
export const ExpectFileStep = z
  .object({ expectFile: z.object({ path: WorkspacePath, content: z.string() }).strict() })
  .strict();
export const CompleteStep = z.object({ complete: z.unknown() }).strict();

/** Per-sandbox resource limits; each one left out takes the host's default (README, "Sandbox processes and limits"). */
export const SandboxLimits = z
  .object({
    /** Processes (and threads) alive at once. */
    processes: z.number().int().min(16).max(1_000_000).optional(),
    /** Memory, in MiB. */
    memoryMiB: z.number().int().min(64).max(16_777_216).optional(),
    /** CPU time per period, in CPUs (0.5 is half of one CPU). */
    cpus: z.number().min(0.01).max(1024).optional(),
    /** Largest file a process may write, in MiB. */
    fileMiB: z.number().int().min(1).max(16_777_216).optional(),
    /** Room for the sandbox's files (workspace, home, envs), in MiB; fixed when its volume is made. */
    diskMiB: z.number().int().min(16).max(16_777_216).optional(),
  })
  .strict();
export type SandboxLimits = z.infer<typeof SandboxLimits>;

export const SandboxSpec = z
  .object({
    provider: ProviderName,
    template: SandboxTemplate.optional(),
    env: EnvMap.optional(),
    workspace: Workspace.optional(),
    limits: SandboxLimits.optional(),
  })
  .strict();

export interface RunSpecShape {
  runId?: string;
  agent:
    | { driver: 'scripted'; steps: StepShape[] }
    | { driver: typeof EXTERNAL_DRIVER }
    | { driver: string; input?: unknown };
  sandbox: z.infer<typeof SandboxSpec>;
  policy?: RunPolicy;
  labels?: Record<string, string>;
}
export type StepShape =
  | z.infer<typeof ExecStep>
  | z.infer<typeof AskStep>
  | { spawn: RunSpecShape }
  | z.infer<typeof HoldStep>
  | z.infer<typeof WriteFileStep>
  | z.infer<typeof ExpectFileStep>
  | z.infer<typeof CompleteStep>;

export const Step: z.ZodType<StepShape> = z.lazy(() =>
  z.union([
    ExecStep,
    AskStep,
    z.object({ spawn: RunSpec }).strict(),
    HoldStep,
    WriteFileStep,
    ExpectFileStep,
    CompleteStep,
  ]),
);

const ScriptedAgent = z
  .object({ driver: z.literal('scripted'), steps: z.array(shallow(Step, { hold: 'too deep' })).min(1) })
  .strict();
/** The agent is a program outside the worker that sends the Run its actions (POST /api/v1/runs/{id}/actions). */
const ExternalAgent = z.object({ driver: z.literal(EXTERNAL_DRIVER) }).strict();
const OtherAgent = z
  .object({
    driver: z
      .string()
      .min(1)
      // Aborting, so a scripted agent with a bad step is reported by its steps, not as this branch.
      .refine((d) => d !== 'scripted', { message: 'the scripted driver needs steps', abort: true })
      .refine((d) => d !== EXTERNAL_DRIVER, { message: 'the external driver takes no input' }),
    input: shallow(z.unknown(), null).optional(),
  })
  .strict();

export const RunSpec: z.ZodType<RunSpecShape> = z.lazy(() =>
  z
    .object({
      runId: NewRunId.optional(),
      agent: z.union([ScriptedAgent, ExternalAgent, OtherAgent]),
      sandbox: SandboxSpec,
      policy: RunPolicy.optional(),
      labels: z.record(z.string(), z.string()).optional(),
    })
    .strict(),
);
export type RunSpec = RunSpecShape;
export type Step = StepShape;

export const Job = z.object({
  id: z.string(),
  command: z.string(),
  pauseBehavior: PauseBehavior,
  executionAffinity: ExecutionAffinity,
  background: z.boolean().optional(),
});
export type Job = z.infer<typeof Job>;

export const InteractionStatus = z.enum(['pending', 'answered', 'expired', 'cancelled']);
export const InteractionKind = z.enum(['approval', 'input']);

export const InteractionRequest = z.object({
  id: z.string(),
  kind: InteractionKind,
  prompt: z.string(),
  title: z.string().optional(),
  details: z.string().optional(),
  action: ReviewedAction.optional(),
  options: z.array(z.string()).optional(),
  /** The answers it accepts, resolved (absent only on interactions asked before this field existed). */
  accepts: z.array(AnswerKind).optional(),
  /** The Run's labels, copied when it was asked. */
  labels: z.record(z.string(), z.string()).optional(),
  createdAt: z.string(),
  status: InteractionStatus,
  response: z.unknown().optional(),
  respondedBy: z.string().optional(),
  respondedAt: z.string().optional(),
  /** An older settled interaction shown without its bulky content (run-state.ts, forgetContent). */
  contentForgotten: z.literal(true).optional(),
});
export type InteractionRequest = z.infer<typeof InteractionRequest>;

/** An answer: an approval decision, an approval with edited arguments, free input, or a chosen option. */
const Comment = z.string().max(10_000).optional();
export const ApprovalResponse = z.object({ decision: z.enum(['approve', 'deny']), comment: Comment }).strict();
export const EditResponse = z
  .object({
    decision: z.literal('edit'),
    action: ReviewedAction.refine(
      (a) => a.command !== undefined || a.files !== undefined || a.diff !== undefined,
      'must change at least one of command, files, diff',
    ).refine((a) => a.command === undefined || a.command.trim() !== '', {
      message: BLANK_COMMAND,
      path: ['command'],
    }),
    comment: Comment,
  })
  .strict();
export const InputResponse = z.object({ input: z.string().max(1_000_000) }).strict();
export const OptionResponse = z.object({ option: z.string().min(1).max(200), comment: Comment }).strict();
export const InteractionResponse = z.union([ApprovalResponse, EditResponse, InputResponse, OptionResponse]);
export type InteractionResponse = z.infer<typeof InteractionResponse>;

/** What the agent receives once a person answered (the result of its ask). */
export interface InteractionAnswer {
  interactionId: string;
  decision?: 'approve' | 'deny' | 'edit';
  /** The edited action, for an `edit`. */
  action?: ReviewedAction;
  input?: string;
  option?: string;
  comment?: string;
  respondedBy?: string;
}

/**
 * A name of who acts, recorded and shown to people: who answered (`respondedBy`), a client's identity.
 * 1-256 characters, without a character shown escaped (common/unsafe-text.ts: a control, a bidi
 * override, an invisible one; `alice\u200b` would read as `alice`, or a name start a line or reorder
 * what is shown), and well-formed Unicode (Temporal would store U+FFFD). common/wire-checks.ts `actor`
 * is the same rule without zod.
 */
export const ActorName = z
  .string()
  .min(1)
  .max(ACTOR_MAX)
  .refine((s) => !CONTROL_CHARACTER.test(s), CONTROL_CHARACTER_PROBLEM)
  .refine((s) => !hasLoneSurrogate(s), LONE_SURROGATE_PROBLEM);

export const RespondInput = z
  .object({
    interactionId: z.string().min(1),
    response: InteractionResponse,
    respondedBy: ActorName.optional(),
  })
  .strict();
export type RespondInput = z.infer<typeof RespondInput>;

/**
 * A client's Temporal identity (StasisClient.withIdentity), recorded on the events of what it does and
 * shown in Temporal Web: an ActorName, as `respondedBy` (256 characters are within Temporal's limit,
 * 1000 bytes, in any encoding).
 */
export const ClientIdentity = ActorName;

/** A pending interaction with its Run, as the list of everything waiting on a person gives it. */
export const PendingInteraction = z.object({
  runId: z.string(),
  /** When the Run started. */
  runStartedAt: z.string().optional(),
  interaction: InteractionRequest,
  /** The diff under review was cut short here (common/interactions.ts, MEMO_DIFF_CHARS); the Run's snapshot has all of it. */
  diffTruncated: z.boolean().optional(),
});
export type PendingInteraction = z.infer<typeof PendingInteraction>;

export const Hashes = z.object({ run: z.string(), spec: z.string(), policy: z.string() });
export type Hashes = z.infer<typeof Hashes>;

export const SuspensionReason = z.enum(['INTERACTION', 'POLICY_HOLD', 'MANUAL']);
export type SuspensionReason = z.infer<typeof SuspensionReason>;

export const Suspension = z.object({
  reason: SuspensionReason,
  pauseMode: PauseMode,
  since: z.string(),
  hashes: Hashes,
  interactionIds: z.array(z.string()),
  expiresAt: z.string().optional(),
});
export type Suspension = z.infer<typeof Suspension>;

export const Checkpoint = z.object({ uri: z.string(), sha256: z.string(), bytes: z.number().int().nonnegative() });
export type Checkpoint = z.infer<typeof Checkpoint>;

export const ResourceState = z.enum(RESOURCE_STATES);
export type ResourceState = z.infer<typeof ResourceState>;

export const ExecutionResourceRecord = z.object({
  sandboxId: z.string(),
  provider: z.string(),
  hostId: z.string().optional(),
  state: ResourceState,
  fence: z.number().int().nonnegative(),
  pauseMode: PauseMode.optional(),
  checkpoint: Checkpoint.optional(),
  attempts: z.number().int().nonnegative(),
  lastError: z.string().optional(),
  blockedSince: z.string().optional(),
  releasedAt: z.string().optional(),
});
export type ExecutionResourceRecord = z.infer<typeof ExecutionResourceRecord>;

export const RunStatus = z.enum(RUN_STATUSES);
export type RunStatus = z.infer<typeof RunStatus>;

/** The most Runs (or pending interactions) one list answers. */
export const MAX_RUN_LIST_LIMIT = 1000;
/** How many Runs (or pending interactions) a list may be asked for. */
export const RunListLimit = z.number().int().min(1).max(MAX_RUN_LIST_LIMIT);
/** How long sending an external agent's action may wait for it, in milliseconds (client and REST). */
export const ActionWaitMs = z.number().int().min(0).max(MAX_ACTION_WAIT_MS);
/** The childState signal: a child Run reports its record state (and status) to its parent. */
export const ChildStateInput = z
  .object({ runId: z.string().min(1), state: ResourceState, status: RunStatus.optional() })
  .strict();
export type ChildStateInput = z.infer<typeof ChildStateInput>;

/** The reconcile signal: a host's worker, after a restart, says whether a sandbox's processes survived. */
export const ReconcileInput = z.object({ hostId: z.string().min(1), alive: z.boolean() }).strict();
export type ReconcileInput = z.infer<typeof ReconcileInput>;

export const RunPhase = z.enum(['ACTIVE', 'SUSPENDING', 'SUSPENDED', 'RESUMING']);
export type RunPhase = z.infer<typeof RunPhase>;

export const RunError = z.object({ code: z.string(), message: z.string() });
export type RunError = z.infer<typeof RunError>;

/** The user-visible view: never the execution-resource state. */
export const RunSnapshot = z.object({
  runId: z.string(),
  status: RunStatus,
  interactions: z.array(InteractionRequest),
  output: z.unknown().optional(),
  error: RunError.optional(),
  parentRunId: z.string().optional(),
  childRunIds: z.array(z.string()),
});
export type RunSnapshot = z.infer<typeof RunSnapshot>;

/** The operator view. */
export const ResourceView = z.object({
  runId: z.string(),
  phase: RunPhase,
  record: ExecutionResourceRecord,
  suspension: Suspension.optional(),
  children: z.array(z.object({ runId: z.string(), state: ResourceState })),
  blockedAgeSeconds: z.number().optional(),
  /** Why the Run takes no agent step now, e.g. it waits for one of its running jobs or child Runs to end (history room). */
  waitingFor: z.string().optional(),
});
export type ResourceView = z.infer<typeof ResourceView>;

// Standalone sandboxes (docs/DESIGN.md, Sandboxes).
export const SandboxState = z.enum([
  'created',
  'running',
  'stopped',
  'paused',
  'suspended',
  'destroyed',
  'failed',
  'lost',
]);
export type SandboxState = z.infer<typeof SandboxState>;

export const SandboxLifecyclePolicy = z.object({ timeout: Duration.optional(), ttl: Duration.optional() }).strict();

/** A label key: it names the label in `key:value` filters, so it holds no ":". */
export const LabelKey = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/, 'a label key is 1-63 letters, digits, ".", "_", "/" or "-"');
export const LabelValue = z
  .string()
  .regex(
    /^[A-Za-z0-9._/@+=:-]{0,256}$/,
    'a label value is up to 256 letters, digits, ".", "_", "/", "@", "+", "=", ":" or "-"',
  );
export const MAX_LABELS = 32;
/** Labels of a sandbox, searchable in Temporal Web as `key:value` (StasisLabels). */
export const Labels = z
  .record(LabelKey, LabelValue)
  .refine((labels) => Object.keys(labels).length <= MAX_LABELS, { message: `at most ${MAX_LABELS} labels` })
  .refine((labels) => labelKeywords(labels).length === Object.keys(labels).length, {
    message: `labels take at most ${LABELS_MAX_CHARS} characters written as key:value`,
  });
export type Labels = z.infer<typeof Labels>;

/** A standalone sandbox: what a Run's sandbox is given, and a lifecycle and labels of its own. */
export const CreateSandboxInput = SandboxSpec.extend({
  policy: SandboxLifecyclePolicy.optional(),
  labels: Labels.optional(),
}).strict();
export type CreateSandboxInput = z.infer<typeof CreateSandboxInput>;

export const ExecInput = z
  .object({
    command: ShellCommand.max(1_000_000),
    timeoutMs: z.number().int().positive().max(86_400_000).optional(),
    env: EnvMap.optional(),
  })
  .strict();
export type ExecInput = z.infer<typeof ExecInput>;

/** Base64 text as Buffer.toString('base64') writes it (padded). */
export const Base64 = z
  .string()
  .regex(/^[A-Za-z0-9+/]*={0,2}$/, 'must be base64')
  .refine((s) => s.length % 4 === 0, { message: 'must be base64 (padded to a multiple of 4 characters)' });

/** The readFile update of a standalone sandbox. */
export const ReadFileInput = z.object({ path: WorkspacePath }).strict();
export type ReadFileInput = z.infer<typeof ReadFileInput>;

/** The writeFile update of a standalone sandbox: the content travels base64-encoded. */
export const WriteFileInput = z.object({ path: WorkspacePath, contentBase64: Base64 }).strict();
export type WriteFileInput = z.infer<typeof WriteFileInput>;

export const ExecResult = z.object({ exitCode: z.number().int(), stdout: z.string(), stderr: z.string() });
export type ExecResult = z.infer<typeof ExecResult>;

export const SandboxView = z.object({
  sandboxId: z.string(),
  state: SandboxState,
  provider: z.string(),
  hostId: z.string().optional(),
  createdAt: z.string(),
  policy: SandboxLifecyclePolicy.optional(),
  record: ExecutionResourceRecord,
  error: RunError.optional(),
  labels: z.record(z.string(), z.string()).optional(),
});
export type SandboxView = z.infer<typeof SandboxView>;

/** A sandbox as visibility (Temporal's list index) last saw it: one entry of a sandbox list. */
export const SandboxSummary = z.object({
  sandboxId: z.string(),
  state: z.string(),
  provider: z.string().optional(),
  hostId: z.string().optional(),
  resourceState: z.string().optional(),
  labels: z.record(z.string(), z.string()),
  createdAt: z.string(),
});
export type SandboxSummary = z.infer<typeof SandboxSummary>;

/** One page of a sandbox list; `nextPageToken` is absent on the last page. */
export const SandboxPage = z.object({ sandboxes: z.array(SandboxSummary), nextPageToken: z.string().optional() });
export type SandboxPage = z.infer<typeof SandboxPage>;

export const MAX_PAGE_SIZE = 1000;
/** Which sandboxes a list shows: by state (all but destroyed when absent) and by labels (`key:value`, all must match). */
export const SandboxListFilter = z
  .object({
    state: SandboxState.optional(),
    label: z
      .array(
        z
          .string()
          .regex(/^[^:]+:/, 'must be key:value')
          .transform((entry) => [entry.slice(0, entry.indexOf(':')), entry.slice(entry.indexOf(':') + 1)])
          .pipe(z.tuple([LabelKey, LabelValue])),
      )
      .max(MAX_LABELS)
      .optional(),
    pageSize: z.number().int().min(1).max(MAX_PAGE_SIZE).optional(),
    nextPageToken: z
      .string()
      .regex(/^[A-Za-z0-9_-]+$/, 'must be a nextPageToken of an earlier page')
      .max(16_384)
      .optional(),
  })
  .strict();
export type SandboxListFilter = z.input<typeof SandboxListFilter>;

export const MetricsSnapshot = z.object({
  active: z.number(),
  retained: z.number(),
  pendingCleanup: z.number(),
  releaseBlocked: z.number(),
  failures: z.number(),
  retries: z.number(),
  oldestBlockedAgeSeconds: z.number(),
  releaseLatencyMs: z.object({ count: z.number(), p50: z.number(), p95: z.number(), max: z.number() }),
});
export type MetricsSnapshot = z.infer<typeof MetricsSnapshot>;

// External agents (README, "Bring your own agent"): the actions a program outside
// the worker sends its Run, and what the Run answers about each.

export const ExecAction = z
  .object({
    type: z.literal('exec'),
    command: ShellCommand.max(ACTION_LIMITS.command),
    pauseBehavior: PauseBehavior.optional(),
    executionAffinity: ExecutionAffinity.optional(),
    timeoutMs: z.number().int().positive().max(ACTION_LIMITS.timeoutMs).optional(),
  })
  .strict();
export const WriteFileAction = z
  .object({ type: z.literal('writeFile'), path: WorkspacePath, content: z.string().max(ACTION_LIMITS.content) })
  .strict();
export const ReadFileAction = z.object({ type: z.literal('readFile'), path: WorkspacePath }).strict();
/** An interaction; the Run suspends until a person answers, and the answer is the result. */
export const AskAction = z
  .object({
    type: z.literal('ask'),
    ask: z.string().min(1).max(ACTION_LIMITS.ask),
    kind: InteractionKind.optional(),
    ...InteractionFields,
  })
  .strict()
  .superRefine((ask, ctx) => {
    const problem = askProblem(ask);
    if (problem) ctx.addIssue({ code: 'custom', path: [problem.path], message: problem.message });
  });
export const SpawnAction = z.object({ type: z.literal('spawn'), spec: RunSpec }).strict();
export const CompleteAction = z
  .object({ type: z.literal('complete'), output: shallow(z.unknown(), null).optional() })
  .strict();
export const FailAction = z
  .object({
    type: z.literal('fail'),
    code: z.string().min(1).max(128).optional(),
    message: z.string().max(ACTION_LIMITS.message),
  })
  .strict();

export const ExternalAction = z.discriminatedUnion('type', [
  ExecAction,
  WriteFileAction,
  ReadFileAction,
  AskAction,
  SpawnAction,
  CompleteAction,
  FailAction,
]);
export type ExternalAction = z.infer<typeof ExternalAction>;

/** One action with its idempotency key: the same key again returns the same result and never runs twice. */
export const ActionRequest = z.object({ actionId: Identifier, action: ExternalAction }).strict();
export type ActionRequest = z.infer<typeof ActionRequest>;

/** running: under way; waiting: an ask waits for a person; succeeded/failed: its result or error is final. */
export const ActionStatus = z.enum(['running', 'waiting', 'succeeded', 'failed']);
export type ActionStatus = z.infer<typeof ActionStatus>;

/** What the Run says about one action. */
export const ActionView = z.object({
  actionId: z.string(),
  type: z.string(),
  status: ActionStatus,
  /** sha-256 of the action's canonical JSON. */
  bodyHash: z.string(),
  /** The interaction an `ask` opened. */
  interactionId: z.string().optional(),
  result: z.unknown().optional(),
  error: RunError.optional(),
  /** The action finished long ago: the Run keeps only its recent results (its outcome stays). */
  resultForgotten: z.boolean().optional(),
});
export type ActionView = z.infer<typeof ActionView>;
