import { setMaxListeners } from 'node:events';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type {
  Capabilities,
  ExecOutcome,
  FencedRequest,
  FileRequest,
  ProviderExecRequest,
  ProviderOp,
  ProvisionRequest,
  RequestContext,
  RestoreRequest,
  RestoreResult,
  SandboxProvider,
  SandboxReleaseReceipt,
  SandboxReleaseRequest,
} from '../providers/api';
import { StasisError } from '../common/errors';
import { FILE_CARRY_LIMIT_BYTES, FILE_LIMIT_BYTES, jsonBytes } from '../common/payload-limits';
import { checkHostPath, type HostPathPolicy } from '../common/host-paths';
import type { Hashes, Workspace } from '../common/schemas';
import { hashMismatches, receiptProblem, recordedHashes } from '../workflows/lifecycle';
import { toFailure, toRestoreFailure } from './failures';
import { boundExecOutcome, execActivityResult } from './exec-output';
import type { WorkerMetrics } from './metrics';

// Thin adapters from the coordinator to the provider registry. They run on the
// host's own task queue (`<queue>@<hostId>`), or on the shared queue when any
// host will do (provision, restore elsewhere).

export interface ProviderActivityDeps {
  hostId: string;
  provider(name: string): SandboxProvider;
  metrics: WorkerMetrics;
  /** Where active workspaces may live on this host: checked again here, as any Temporal client can start a Run. */
  hostPaths: HostPathPolicy;
  /** Whether this worker delivers webhooks (STASIS_WEBHOOK_URL): told to a Run with its sandbox. */
  webhooks?: boolean;
}

export interface Owner {
  provider: string;
  ownerId: string;
  labels?: Record<string, string>;
}

export type FileEncoding = 'utf8' | 'base64';

/** How a fused resume brings the sandbox back: attach to it live, or restore (re-provision) it. */
export type BringBack = { op: 'attach'; request: FencedRequest } | { op: 'restore'; request: RestoreRequest };

/** Where and how the sandbox came back; `restored` only from a restore. */
export interface BroughtBack {
  hostId: string;
  capabilities: Capabilities;
  restored?: RestoreResult;
}

/**
 * What a fused resume answers: where the sandbox came back, and the job's outcome. No outcome: the
 * restored checkpoint was recorded under other hashes, so nothing ran (the workflow refuses to go on).
 */
export interface ResumedExec {
  resumed: BroughtBack;
  outcome?: ExecOutcome;
}

/** The details of a fused resume's failure once the sandbox was back: only the job failed. */
export interface ResumedThenFailed {
  resumedThenFailed: BroughtBack;
}

/**
 * What sandboxOp answers (nothing, from a worker of an earlier version or to a caller that did not ask):
 * for a destroy asked `reportCheckpointsDeleted`, whether the provider deleted every checkpoint of the
 * sandbox too, so the workflow need not delete them itself.
 */
export interface SandboxOpResult {
  checkpointsDeleted?: boolean;
}

/** A file of a sandbox; `fence` is absent only in calls scheduled before file access was fenced. */
export interface FileAt {
  sandboxId: string;
  fence?: number;
  path: string;
}

/**
 * A provider's beats in the first second of a call do not reach Temporal. The SDK sends an activity's
 * first heartbeat at once, one server write each: the local provider beats as a call starts, so every
 * exec, release and restore cost the server a write the bare workflow does not have (issue 17), and a
 * short call's completion could wait for it. A hung call is still cut: the heartbeat timeout (30 s)
 * runs from the start, and the beats from the second second on go through.
 */
export const QUIET_START_MS = 1_000;

function fileRequest(input: FileAt): FileRequest {
  return { sandboxId: input.sandboxId, path: input.path, ...(input.fence !== undefined ? { fence: input.fence } : {}) };
}

export function createProviderActivities(deps: ProviderActivityDeps) {
  /**
   * Runs a provider call with the activity's cancellation. The provider heartbeats
   * itself while it makes progress, so a hung call is cut by the heartbeat timeout.
   */
  async function call<T>(owner: Owner, fn: (p: SandboxProvider, ctx: RequestContext) => Promise<T>): Promise<T> {
    const activity = Context.current();
    // Every store request of the call (a checkpoint's parallel uploads and downloads) listens to
    // it and removes its listener when done: more than Node's leak warning threshold of 10 is expected.
    setMaxListeners(0, activity.cancellationSignal);
    deps.metrics.recordAttempt(activity.info.attempt);
    const startedAt = Date.now();
    const ctx: RequestContext = {
      ownerId: owner.ownerId,
      hostId: deps.hostId,
      ...(owner.labels ? { labels: owner.labels } : {}),
      signal: activity.cancellationSignal,
      heartbeat: (details?: unknown) => {
        if (Date.now() - startedAt >= QUIET_START_MS) activity.heartbeat(details);
      },
    };
    try {
      return await fn(deps.provider(owner.provider), ctx);
    } catch (err) {
      deps.metrics.recordFailure();
      throw err;
    }
  }

  /** A provider this worker does not have, asked to provision, is the caller's mistake: INVALID_ARGUMENT naming it. */
  function checkProviderNamed(name: string): void {
    try {
      deps.provider(name);
    } catch (err) {
      if (err instanceof StasisError && err.code === 'NOT_FOUND')
        throw new StasisError('INVALID_ARGUMENT', `provider: ${err.message}`);
      throw err;
    }
  }

  function throwRestoreFailure(err: unknown): never {
    throw toRestoreFailure(err);
  }

  /** An active workspace outside STASIS_HOST_PATHS is refused (non-retryable) before the provider touches it. */
  async function checkWorkspace(workspace: Workspace | undefined): Promise<void> {
    if (workspace?.kind === 'active')
      await checkHostPath(workspace.hostPath, deps.hostPaths, 'sandbox.workspace.hostPath');
  }

  return {
    async provisionSandbox(
      input: Owner & { request: ProvisionRequest; start: boolean },
    ): Promise<{ hostId: string; capabilities: Capabilities; webhooks: boolean }> {
      await checkWorkspace(input.request.workspace);
      checkProviderNamed(input.provider);
      // The run id of the provisioning workflow: its retries share it, a later Run of the same id has its own.
      const provisionId = Context.current().info.workflowExecution?.runId;
      const request = provisionId ? { ...input.request, provisionId } : input.request;
      return call(input, async (p, ctx) => {
        await p.provision(request, ctx);
        if (input.start) await p.start({ sandboxId: input.request.sandboxId, fence: input.request.fence }, ctx);
        return { hostId: deps.hostId, capabilities: p.capabilities, webhooks: deps.webhooks === true };
      });
    },

    async sandboxOp(
      input: Owner & { op: ProviderOp; request: FencedRequest; reportCheckpointsDeleted?: boolean },
    ): Promise<SandboxOpResult | undefined> {
      return call(input, async (p, ctx) => {
        await p[input.op](input.request, ctx);
        // Only to a caller that asks: workflow code of an earlier version, which deletes the checkpoints
        // whatever this says, must not have an answer in its history that a later version reads as
        // "skip the delete" on replay (a worker fleet mid-upgrade: a nondeterminism error at the Run's end).
        return input.op === 'destroy' && input.reportCheckpointsDeleted === true && p.destroyDeletesCheckpoints === true
          ? { checkpointsDeleted: true }
          : undefined;
      });
    },

    async execInSandbox(input: Owner & { request: ProviderExecRequest; keepOutput?: false }): Promise<ExecOutcome> {
      return execActivityResult(await call(input, (p, ctx) => p.exec(input.request, ctx)), input.keepOutput);
    },

    async releaseSandbox(
      input: Owner & { request: SandboxReleaseRequest },
    ): Promise<SandboxReleaseReceipt & { attempt: number }> {
      const info = Context.current().info;
      const receipt = await call(input, (p, ctx) => p.release(input.request, ctx));
      const problem = receiptProblem(input.request, receipt);
      if (problem) {
        deps.metrics.recordFailure();
        // Retried by Temporal: a release counts only when the receipt confirms it.
        throw ApplicationFailure.create({ type: 'COMPUTE_NOT_RELEASED', message: `provider ${problem}` });
      }
      // Diagnostics only (the receipt is what guards exactly-once): counted now, written to the durable
      // figures behind the release rather than in its path; a normal shutdown waits for the write.
      void deps.metrics.recordReleaseLatency(Date.now() - info.scheduledTimestampMs);
      return { ...receipt, attempt: info.attempt };
    },

    async restoreSandbox(
      input: Owner & { request: RestoreRequest },
    ): Promise<RestoreResult & { hostId: string; capabilities: Capabilities }> {
      await checkWorkspace(input.request.workspace);
      return call(input, async (p, ctx) => ({
        ...(await p.restore(input.request, ctx).catch(throwRestoreFailure)),
        hostId: deps.hostId,
        capabilities: p.capabilities,
      }));
    },

    /**
     * A resume fused with the job that follows it: one activity instead of two (and a workflow task
     * between them). The sandbox comes back as restoreSandbox or the attach sandboxOp would bring it
     * (both are idempotent, so a retried attempt brings it back again harmlessly); the checkpoint's
     * recorded hashes are checked before anything runs; then the job runs under the job journal as
     * execInSandbox runs it (a retry never runs the command twice). A job that fails once the sandbox
     * is back fails with ResumedThenFailed details, so the workflow knows the resume itself held.
     */
    async resumeAndExecInSandbox(
      input: Owner & { bringBack: BringBack; expect: Hashes; request: ProviderExecRequest },
    ): Promise<ResumedExec> {
      let resumed: BroughtBack;
      if (input.bringBack.op === 'restore') {
        const request = input.bringBack.request;
        await checkWorkspace(request.workspace);
        resumed = await call(input, async (p, ctx) => ({
          restored: await p.restore(request, ctx).catch(throwRestoreFailure),
          hostId: deps.hostId,
          capabilities: p.capabilities,
        }));
        if (hashMismatches(input.expect, recordedHashes(resumed.restored)).length > 0) return { resumed };
      } else {
        const request = input.bringBack.request;
        resumed = await call(input, async (p, ctx) => {
          await p.attach(request, ctx);
          return { hostId: deps.hostId, capabilities: p.capabilities };
        });
      }
      // Timed out meanwhile, the resume may be retried on another host, job and all: never run the job twice.
      Context.current().cancellationSignal.throwIfAborted();
      try {
        return { resumed, outcome: boundExecOutcome(await call(input, (p, ctx) => p.exec(input.request, ctx))) };
      } catch (err) {
        // A cancelled job stays a cancellation (as execInSandbox's does), so the cancelled Run ends CANCELLED.
        if (Context.current().cancellationSignal.aborted) throw err;
        const failure = toFailure(err);
        const details: ResumedThenFailed = { resumedThenFailed: resumed };
        throw ApplicationFailure.create({
          type:
            (failure instanceof ApplicationFailure ? failure.type : undefined) ??
            (err instanceof Error ? err.name : 'Error'),
          message: err instanceof Error ? err.message : String(err),
          nonRetryable: failure instanceof ApplicationFailure && failure.nonRetryable === true,
          details: [details],
        });
      }
    },

    /** Files cross as text: utf8 for agents' text files, base64 for raw bytes (workflows have no Buffer). */
    async readSandboxFile(input: Owner & FileAt & { encoding: FileEncoding }): Promise<{ content: string }> {
      return call(input, async (p, ctx) => {
        const bytes = await p.readFile(fileRequest(input), ctx).catch((err: unknown) => {
          throw err instanceof StasisError && err.code === 'PAYLOAD_TOO_LARGE' ? tooLargeToCarry(err.message) : err;
        });
        // Whatever the provider (a plugin) handed back: more would fail the activity's completion, retried for minutes.
        if (bytes.length > FILE_LIMIT_BYTES) {
          throw tooLargeToCarry(`path ${JSON.stringify(input.path)}: more than ${FILE_LIMIT_BYTES} bytes`);
        }
        // What travels is the contents as JSON text: refused before sending what Temporal would not carry.
        const content = bytes.toString(input.encoding);
        const carried = jsonBytes(content);
        if (carried > FILE_CARRY_LIMIT_BYTES) {
          throw tooLargeToCarry(
            `path ${JSON.stringify(input.path)}: its ${bytes.length} bytes are ${carried} bytes as JSON text ` +
              `(a control character travels as a six-byte escape, a byte that is not UTF-8 as U+FFFD), ` +
              `more than the ${FILE_CARRY_LIMIT_BYTES} a file read may be`,
          );
        }
        return { content };
      });
    },

    async writeSandboxFile(input: Owner & FileAt & { content: string; encoding: FileEncoding }): Promise<void> {
      await call(input, (p, ctx) =>
        p.writeFile({ ...fileRequest(input), content: Buffer.from(input.content, input.encoding) }, ctx),
      );
    },
  };
}

export type ProviderActivities = ReturnType<typeof createProviderActivities>;

/** A file too large for a payload is refused at once: another attempt reads the same file. */
function tooLargeToCarry(message: string): ApplicationFailure {
  return ApplicationFailure.create({ type: 'PAYLOAD_TOO_LARGE', message, nonRetryable: true });
}
