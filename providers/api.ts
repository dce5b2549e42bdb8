import { z } from 'zod';
import {
  Checkpoint,
  EnvMap,
  type ExecResult,
  PauseMode,
  SandboxLimits,
  SandboxTemplate,
  ShellCommand,
  Workspace,
} from '../common/schemas';

// Sandbox plugin API v3 (docs/DESIGN.md, Providers and drivers). The schemas validate what a provider
// module exports and every request and receipt that crosses it.

export const Capabilities = z
  .object({
    pauseModes: z.array(PauseMode),
    pause: z.boolean(),
    crossHostRestore: z.boolean(),
  })
  .strict();
export type Capabilities = z.infer<typeof Capabilities>;

/** The data part of a request's context; signal and heartbeat are added by the activity. */
export const RequestContextData = z.object({
  /** Which Run or standalone sandbox the call serves. */
  ownerId: z.string(),
  hostId: z.string(),
  /** Stored with a checkpoint and handed back on restore (run/spec/policy hashes). */
  labels: z.record(z.string(), z.string()).optional(),
});
export type RequestContext = z.infer<typeof RequestContextData> & {
  /** Aborted when Temporal cancels the activity; long calls stop at the next safe point. */
  signal?: AbortSignal;
  /** Called while a long call makes progress so the activity heartbeats. */
  heartbeat?: (details?: unknown) => void;
};

export const SandboxReleaseRequest = z
  .object({
    sandboxId: z.string().min(1),
    idempotencyKey: z.string().min(1),
    mode: PauseMode,
    fence: z.number().int().nonnegative(),
    reason: z.string(),
  })
  .strict();
export type SandboxReleaseRequest = z.infer<typeof SandboxReleaseRequest>;

export const SandboxReleaseReceipt = z.object({
  sandboxId: z.string(),
  idempotencyKey: z.string(),
  mode: PauseMode,
  computeReleased: z.boolean(),
  duplicate: z.boolean(),
  checkpoint: Checkpoint.optional(),
  fence: z.number().int(),
  releasedAt: z.string(),
});
export type SandboxReleaseReceipt = z.infer<typeof SandboxReleaseReceipt>;

export const ProvisionRequest = z.object({
  sandboxId: z.string().min(1),
  fence: z.number().int().nonnegative(),
  /**
   * Which provisioning this is (Stasis sends the Temporal run id of the workflow that provisions). A
   * retry carries the same and finds its own sandbox; a provider refuses one that finds the sandbox
   * provisioned under another (INVALID_STATE_TRANSITION) rather than hand it that one's workspace,
   * env and checkpoints: a Run or sandbox id used again once the namespace has forgotten the first.
   */
  provisionId: z.string().min(1).optional(),
  template: SandboxTemplate.optional(),
  env: EnvMap.optional(),
  workspace: Workspace.optional(),
  limits: SandboxLimits.optional(),
});
export type ProvisionRequest = z.infer<typeof ProvisionRequest>;

export const FencedRequest = z.object({ sandboxId: z.string().min(1), fence: z.number().int().nonnegative() });
export type FencedRequest = z.infer<typeof FencedRequest>;

export const ProviderExecRequest = FencedRequest.extend({
  jobId: z.string().min(1),
  command: ShellCommand,
  timeoutMs: z.number().int().positive().optional(),
  env: EnvMap.optional(),
});
export type ProviderExecRequest = z.infer<typeof ProviderExecRequest>;

export const RestoreRequest = FencedRequest.extend({
  /** Absent: re-provision compute on the host-persistent workspace (after TERMINATE). */
  checkpoint: Checkpoint.optional(),
  env: EnvMap.optional(),
  workspace: Workspace.optional(),
  limits: SandboxLimits.optional(),
});
export type RestoreRequest = z.infer<typeof RestoreRequest>;

export const RestoreResult = z.object({
  /** `local-copy` when a dormant copy on this host was reused, `checkpoint` when downloaded. */
  source: z.enum(['local-copy', 'checkpoint', 'workspace']),
  labels: z.record(z.string(), z.string()).optional(),
});
export type RestoreResult = z.infer<typeof RestoreResult>;

export const FileRequest = z.object({
  sandboxId: z.string().min(1),
  /** The caller's fence: a file call from an owner that has been superseded is refused like any other call. */
  fence: z.number().int().nonnegative().optional(),
  path: z.string().min(1),
});
export type FileRequest = z.infer<typeof FileRequest>;

/** What a provider's exec answers: the wire's ExecResult, under the plugin API's own name. */
export type ExecOutcome = ExecResult;

/**
 * The provider calls that take only a fenced request and answer nothing: the `sandboxOp`
 * activity makes them by name. (A sandbox's state transitions are another list: SandboxOp.)
 */
export type ProviderOp = 'start' | 'stop' | 'pause' | 'resume' | 'destroy' | 'attach';

export interface SandboxProvider {
  apiVersion: 3;
  name: string;
  capabilities: Capabilities;
  provision(request: ProvisionRequest, context: RequestContext): Promise<void>;
  /** Re-binds to a live sandbox under a new fence (after DETACH or a cancelled release). */
  attach(request: FencedRequest, context: RequestContext): Promise<void>;
  /** Starts the sandbox's compute (its init process) on a provisioned workspace. */
  start(request: FencedRequest, context: RequestContext): Promise<void>;
  exec(request: ProviderExecRequest, context: RequestContext): Promise<ExecOutcome>;
  /** Stops every process of the sandbox; its workspace stays. */
  stop(request: FencedRequest, context: RequestContext): Promise<void>;
  pause(request: FencedRequest, context: RequestContext): Promise<void>;
  resume(request: FencedRequest, context: RequestContext): Promise<void>;
  restore(request: RestoreRequest, context: RequestContext): Promise<RestoreResult>;
  destroy(request: FencedRequest, context: RequestContext): Promise<void>;
  /**
   * True when destroy deletes every checkpoint of the sandbox before it answers (the local providers
   * do, under the sandbox's lock): a Run's end then sends no delete of its own (workflows/coordinator.ts).
   */
  destroyDeletesCheckpoints?: boolean;
  readFile(request: FileRequest, context: RequestContext): Promise<Buffer>;
  writeFile(request: FileRequest & { content: Buffer }, context: RequestContext): Promise<void>;
  release(request: SandboxReleaseRequest, context: RequestContext): Promise<SandboxReleaseReceipt>;
  /** Live processes of the sandbox on this host (reconcile, tests, metrics). */
  processCount(sandboxId: string): Promise<number>;
  /** Sandboxes this host holds, with whether their processes survived (reconcile after restart). */
  listSandboxes(): Promise<{ sandboxId: string; alive: boolean; dormant: boolean }[]>;
  /** Closes client handles only; never releases compute. */
  close(): Promise<void>;
}

const fn = z.custom<(...args: never[]) => unknown>((v) => typeof v === 'function', 'must be a function');

/** What the registry checks of a provider module's export before the worker starts. */
export const ProviderShape = z.object({
  apiVersion: z.literal(3, { error: 'apiVersion must be 3 (plugin API v3); v2 providers are not supported' }),
  name: z.string().min(1),
  capabilities: Capabilities,
  provision: fn,
  attach: fn,
  start: fn,
  exec: fn,
  stop: fn,
  pause: fn,
  resume: fn,
  restore: fn,
  destroy: fn,
  destroyDeletesCheckpoints: z.boolean().optional(),
  readFile: fn,
  writeFile: fn,
  release: fn,
  processCount: fn,
  listSandboxes: fn,
  close: fn,
});

/** What a provider factory gets from the worker that loads it. */
export interface ProviderDeps {
  hostId: string;
  /** This host's data directory; a provider keeps its sandboxes below it. */
  dataDir: string;
  store: import('../stores/api').CheckpointStore;
  /** Whether each sandbox's files get their own size-limited volume; `off` unless given. */
  volumes?: import('./volume').VolumeMode;
}

/**
 * A provider module exports (as `default` or `provider`) either the provider
 * object or a factory that builds it from the worker's dependencies.
 */
export type ProviderModuleExport = SandboxProvider | ((deps: ProviderDeps) => SandboxProvider);
