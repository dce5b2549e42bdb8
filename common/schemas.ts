import { z } from 'zod';
import { Duration } from './duration';
import { findJsonProblem, hasLoneSurrogate } from './wire-json';

// The wire types of SPEC sections 1, 2, 3 and 6. Every surface (client, API,
// workflows, providers) takes its types from here with z.infer.

export const Identifier = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, 'must be letters, digits, ".", "_" or "-"');

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

/** Longest file name, and longest path, a Linux file system takes (bytes of UTF-8). */
const NAME_MAX_BYTES = 255;
const PATH_MAX_BYTES = 4095;
/** UTF-8 length, counted by hand: workflow code (which validates too) has no Buffer. */
const utf8Bytes = (s: string): number => {
  let bytes = 0;
  for (const ch of s) {
    const code = ch.codePointAt(0)!;
    bytes += code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
  }
  return bytes;
};

/**
 * A path inside the sandbox workspace, in one spelling only: relative, names
 * separated by single `/`, no `.` or `..` name, no trailing `/`, no NUL, well-formed
 * Unicode (so it means the same file on every hop), within the file system's limits.
 */
export const WorkspacePath = z
  .string()
  .min(1)
  .superRefine((p, ctx) => {
    const names = p.split('/');
    const problem = p.startsWith('/')
      ? 'must be relative to the workspace'
      : names.includes('..')
        ? 'must not contain ".."'
        : names.includes('.') || names.includes('')
          ? 'must not contain "." names, "//" or a trailing "/"'
          : p.includes('\0') || hasLoneSurrogate(p)
            ? 'must not contain NUL or a lone surrogate'
            : utf8Bytes(p) > PATH_MAX_BYTES || names.some((n) => utf8Bytes(n) > NAME_MAX_BYTES)
              ? `must be at most ${PATH_MAX_BYTES} bytes, each name at most ${NAME_MAX_BYTES}`
              : undefined;
    if (problem) ctx.addIssue({ code: 'custom', message: `${problem} (a relative path inside the workspace)` });
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
export const AskStep = z
  .object({
    ask: z.string().min(1),
    kind: z.enum(['approval', 'input']).optional(),
    onDeny: z.enum(['fail', 'continue']).optional(),
  })
  .strict();
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
  agent: { driver: 'scripted'; steps: StepShape[] } | { driver: string; input?: unknown };
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
const OtherAgent = z
  .object({
    driver: z
      .string()
      .min(1)
      .refine((d) => d !== 'scripted', { message: 'the scripted driver needs steps' }),
    input: shallow(z.unknown(), null).optional(),
  })
  .strict();

export const RunSpec: z.ZodType<RunSpecShape> = z.lazy(() =>
  z
    .object({
      runId: Identifier.optional(),
      agent: z.union([ScriptedAgent, OtherAgent]),
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
  options: z.array(z.string()).optional(),
  createdAt: z.string(),
  status: InteractionStatus,
  response: z.unknown().optional(),
  respondedBy: z.string().optional(),
  respondedAt: z.string().optional(),
});
export type InteractionRequest = z.infer<typeof InteractionRequest>;

/** An answer: an approval decision or free input. */
export const ApprovalResponse = z
  .object({ decision: z.enum(['approve', 'deny']), comment: z.string().max(10_000).optional() })
  .strict();
export const InputResponse = z.object({ input: z.string().max(1_000_000) }).strict();
export const InteractionResponse = z.union([ApprovalResponse, InputResponse]);
export type InteractionResponse = z.infer<typeof InteractionResponse>;

export const RespondInput = z
  .object({
    interactionId: z.string().min(1),
    response: InteractionResponse,
    respondedBy: z.string().min(1).max(256).optional(),
  })
  .strict();
export type RespondInput = z.infer<typeof RespondInput>;

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

export const ResourceState = z.enum([
  'PROVISIONING',
  'ACTIVE',
  'RELEASING',
  'RELEASE_BLOCKED',
  'RETAINED',
  'RELEASED',
  'RESTORING',
  'DESTROYED',
]);
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

export const RunStatus = z.enum(['RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'CANCELLED', 'EXPIRED']);
export type RunStatus = z.infer<typeof RunStatus>;
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
});
export type ResourceView = z.infer<typeof ResourceView>;

// Standalone sandboxes (SPEC section 3).
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

export const CreateSandboxInput = z
  .object({
    provider: ProviderName,
    template: SandboxTemplate.optional(),
    env: EnvMap.optional(),
    workspace: Workspace.optional(),
    limits: SandboxLimits.optional(),
    policy: SandboxLifecyclePolicy.optional(),
  })
  .strict();
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
});
export type SandboxView = z.infer<typeof SandboxView>;

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
