import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import { sha256Hex } from '../common/hashes';
import { CHILD_RUN_MARK, RUN_ID_MAX, SANDBOX_WORKFLOW_PREFIX } from '../common/wire-checks';
import type {
  ActionRequest,
  ActionView,
  ChildStateInput,
  CreateSandboxInput,
  ExecInput,
  ExecResult,
  InteractionRequest,
  ReconcileInput,
  ResourceView,
  RespondInput,
  RunSnapshot,
  RunSpec,
  SandboxView,
} from '../common/schemas';
import type { CarriedAggregate } from './run-state';
import type { SandboxAggregate } from './sandbox-aggregate';

// Every workflow message, defined once and shared by workflows and client.

export interface RunWorkflowInput {
  spec: RunSpec;
  parentRunId?: string;
  /**
   * Set by continue-as-new: the session aggregate carried over, without its spec (the input's `spec`
   * is the same; carried twice, a large spec alone could pass Temporal's payload limit).
   */
  carried?: CarriedAggregate;
}

export interface SandboxWorkflowInput {
  sandboxId: string;
  create: CreateSandboxInput;
  /** STASIS_SUSPENDED_RETENTION_SECONDS of the process that created it (0 = keep). */
  suspendedRetentionSeconds: number;
  carried?: SandboxAggregate;
}

// Runs
export const respondUpdate = defineUpdate<InteractionRequest, [RespondInput]>('respond');
export const respondSignal = defineSignal<[RespondInput]>('respondSignal');
// A Run's suspend and resume have names of their own: a sandbox's `suspend` and `resume`
// answer a SandboxView. Runs still answer the old names, for clients built before.
export const suspendRunUpdate = defineUpdate<RunSnapshot, []>('suspendRun');
export const resumeRunUpdate = defineUpdate<RunSnapshot, []>('resumeRun');
/** The names a Run's suspend and resume had first; still served. */
export const legacySuspendRunUpdate = defineUpdate<RunSnapshot, []>('suspend');
export const legacyResumeRunUpdate = defineUpdate<RunSnapshot, []>('resume');
export const snapshotQuery = defineQuery<RunSnapshot>('snapshot');
export const resourceQuery = defineQuery<ResourceView>('resource');
/** A child Run reports its record state to its parent. */
export const childStateSignal = defineSignal<[ChildStateInput]>('childState');
/** A parent checks that a child it cannot watch (started before a continue-as-new) is still open: signalling a closed Run fails. */
export const childPingSignal = defineSignal<[]>('childPing');
/** An external agent's next action (idempotent by actionId); answers once the Run has taken it. */
export const actUpdate = defineUpdate<ActionView, [ActionRequest]>('act');
/** One action of an external agent by actionId: its status, and its result once settled (null: unknown). */
export const actionQuery = defineQuery<ActionView | null, [string]>('action');

// Standalone sandboxes
export const startSandboxUpdate = defineUpdate<SandboxView, []>('start');
export const stopSandboxUpdate = defineUpdate<SandboxView, []>('stop');
export const pauseSandboxUpdate = defineUpdate<SandboxView, []>('pause');
export const resumeSandboxUpdate = defineUpdate<SandboxView, []>('resume');
export const suspendSandboxUpdate = defineUpdate<SandboxView, []>('suspend');
export const destroySandboxUpdate = defineUpdate<SandboxView, []>('destroy');
export const execSandboxUpdate = defineUpdate<ExecResult, [ExecInput]>('exec');
/** Files travel base64-encoded inside the update payload, up to FILE_LIMIT_BYTES. */
export const readFileUpdate = defineUpdate<{ contentBase64: string }, [{ path: string }]>('readFile');
export const writeFileUpdate = defineUpdate<void, [{ path: string; contentBase64: string }]>('writeFile');
export const sandboxQuery = defineQuery<SandboxView>('sandbox');
/** Answers once the sandbox is provisioned (state `created`), so create returns a usable sandbox. */
export const sandboxReadyUpdate = defineUpdate<SandboxView, []>('ready');
/** The host's worker, after a restart, reports whether the sandbox's processes survived. */
export const reconcileSignal = defineSignal<[ReconcileInput]>('reconcile');

export const sandboxWorkflowId = (sandboxId: string): string => `${SANDBOX_WORKFLOW_PREFIX}${sandboxId}`;

/** The id of a Run's `n`th child when its spawn gives none: `<parentRunId>.child-<n>`, as Runs before the cap had it. */
export const plainChildRunId = (parentRunId: string, n: number): string => `${parentRunId}${CHILD_RUN_MARK}${n}`;

/**
 * The id of a Run's `n`th child when its spawn gives none: plainChildRunId while that is a new Run's id
 * (at most RUN_ID_MAX characters), else the parent's id cut short, a digest of the whole of it (so
 * parents alike in their first hundred characters never share a child id) and the child's number:
 * `<first characters>.h<16 hex>.child-<n>`, exactly RUN_ID_MAX long. A longer id (deep nesting, a
 * long parent id) was started, but neither the client nor REST could address it, so nobody could
 * answer the child.
 */
export function childRunId(parentRunId: string, n: number): string {
  const plain = plainChildRunId(parentRunId, n);
  if (plain.length <= RUN_ID_MAX) return plain;
  const tail = `.h${sha256Hex(parentRunId).slice(0, 16)}${CHILD_RUN_MARK}${n}`;
  return `${parentRunId.slice(0, RUN_ID_MAX - tail.length)}${tail}`;
}
