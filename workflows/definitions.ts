import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type {
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
import type { SessionAggregate } from './run-state';
import type { SandboxAggregate } from './sandbox-state';

// Every message of SPEC section 5, defined once and shared by workflows and client.

export interface RunWorkflowInput {
  spec: RunSpec;
  parentRunId?: string;
  /** Set by continue-as-new: the whole session aggregate carried over. */
  carried?: SessionAggregate;
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
export const suspendRunUpdate = defineUpdate<RunSnapshot, []>('suspend');
export const resumeRunUpdate = defineUpdate<RunSnapshot, []>('resume');
export const snapshotQuery = defineQuery<RunSnapshot>('snapshot');
export const resourceQuery = defineQuery<ResourceView>('resource');
/** A child Run reports its record state to its parent. */
export const childStateSignal = defineSignal<[ChildStateInput]>('childState');
/** A parent checks that a child it cannot watch (started before a continue-as-new) is still open: signalling a closed Run fails. */
export const childPingSignal = defineSignal<[]>('childPing');

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

/** Largest file the sandbox file routes carry through a Temporal payload. */
export const FILE_LIMIT_BYTES = 1024 * 1024;

export const sandboxWorkflowId = (sandboxId: string): string => `sandbox-${sandboxId}`;
