import {
  ActivityCancellationType,
  ApplicationFailure,
  ActivityFailure,
  CancellationScope,
  TimeoutFailure,
  condition,
  isCancellation,
  patched,
  proxyActivities,
  workflowInfo,
  type ActivityOptions,
} from '@temporalio/workflow';
import { TimeoutType } from '@temporalio/common';
import type { Activities } from '../activities';
import type { BringBack, FileEncoding, ResumedExec, ResumedThenFailed } from '../activities/provider';
import type { ExecOutcome } from '../providers/api';
import type { EnvMap, ExecutionResourceRecord, Hashes, PauseMode, SandboxLimits, Workspace } from '../common/schemas';
import type { z } from 'zod';
import type { Capabilities, ProviderOp, RestoreResult } from '../providers/api';
import { nonRetryableErrorTypes } from '../common/errors';
import { destroyingState, planResume, RELEASE_RETRY, releaseIdempotencyKey, type ResumePlan } from './lifecycle';
import { failureMessage } from './failures';
import { nowIso } from './clock';

// ExecutionBindingLifecycleCoordinator: the workflow-side owner of one
// ExecutionResourceRecord. It provisions, attaches, restores and releases the
// sandbox by calling provider activities on the host's own task queue.

const PROVIDER_CALL: ActivityOptions = {
  startToCloseTimeout: '30m',
  // Providers heartbeat every few seconds; 30 s leaves room for a worker busy with hundreds of
  // sandboxes (the benchmark saw 10 s exceeded under load) while a dead worker is still noticed.
  heartbeatTimeout: '30s',
  retry: {
    initialInterval: '1s',
    backoffCoefficient: 2,
    maximumInterval: '30s',
    maximumAttempts: 5,
    nonRetryableErrorTypes: nonRetryableErrorTypes(),
  },
  cancellationType: ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
};

/**
 * Restores (and re-provisions) wait out an unavailable object store or host the
 * way releases do: 1 s doubling to 5 min, no attempt limit. A store that is down
 * for minutes must not fail a Run whose checkpoint is safe; what no retry can
 * fix (the non-retryable codes: a missing or invalid checkpoint, a stale fence) still fails at once.
 */
const RESTORE_RETRY: ActivityOptions['retry'] = {
  initialInterval: '1s',
  backoffCoefficient: 2,
  maximumInterval: '5m',
  nonRetryableErrorTypes: nonRetryableErrorTypes(),
};

/** A failed resume rolls the record back to the state it resumed from (it used to stay RESTORING). */
export const PATCH_RESUME_ROLLBACK = 'resume-rollback';
/** A release that failed or was cancelled leaves the record ACTIVE (it used to stay RELEASING). */
export const PATCH_RELEASE_OUTCOME = 'release-outcome';

/** A provider that does not restore across hosts is restored only on its own host (it used to go to any host). */
export const PATCH_HOST_BOUND_RESTORE = 'host-bound-restore';
/** Destroy hands what its host could not remove to that host's maintenance and deletes every checkpoint. */
export const PATCH_DESTROY_HANDOFF = 'destroy-handoff';
/** A destroy's record says DESTROYING until it is done (it read ACTIVE, or what it was, meanwhile). */
export const PATCH_DESTROYING = 'destroying-state';

/** Object-store clean-up: no attempt limit, since nothing else would ever delete what it leaves. */
const UNTIL_DONE: ActivityOptions['retry'] = {
  initialInterval: '1s',
  backoffCoefficient: 2,
  maximumInterval: '5m',
  nonRetryableErrorTypes: nonRetryableErrorTypes(),
};

/** How long a host may leave a restore unclaimed before it counts as gone (then any host restores). */
export const HOST_SCHEDULE_TO_START = '30s';

/**
 * How long other calls wait for the sandbox's host to take them. A backlog on a busy host is
 * not a dead host: only a host silent this long fails the call.
 */
export const HOST_BUSY_LIMIT = '10m';

export interface SandboxBinding {
  ownerId: string;
  provider: string;
  template?: string;
  env?: z.infer<typeof EnvMap>;
  workspace: Workspace;
  limits?: SandboxLimits;
}

/** A resume under way: how the sandbox comes back, and the record state it left. */
export interface ResumeStart {
  plan: ResumePlan;
  before: ExecutionResourceRecord['state'];
}

export class ExecutionBindingLifecycleCoordinator {
  capabilities?: Capabilities;
  /** Whether the worker that provisioned the sandbox delivers webhooks (undefined: not told). */
  webhooks?: boolean;
  /** Why the release started last failed for good (compute was not released), if it did. */
  releaseFailure?: unknown;
  private releaseScope?: CancellationScope;
  private releasing?: Promise<void>;
  /** A resume a cancellation cut short (the record still RESTORING): its compute may be back, in part or whole. */
  private cutShort?: ResumeStart;

  constructor(
    readonly record: ExecutionResourceRecord,
    private readonly binding: SandboxBinding,
    private readonly onChange: () => void,
    /** patched() as the owning workflow decides it (a Run's baseline, workflows/run-controller.ts). */
    private readonly isPatched: (patchId: string) => boolean = patched,
  ) {}

  private get owner() {
    return { provider: this.binding.provider, ownerId: this.binding.ownerId };
  }

  /** Activities on the host that holds the sandbox. */
  private onHost(options: Partial<ActivityOptions> = {}, hostId = this.record.hostId): Activities {
    const queue = workflowInfo().taskQueue;
    return proxyActivities<Activities>({
      ...PROVIDER_CALL,
      ...options,
      taskQueue: hostId ? `${queue}@${hostId}` : queue,
    });
  }

  /** Activities any host may take (provisioning, restoring elsewhere). */
  private onAnyHost(options: Partial<ActivityOptions> = {}): Activities {
    return proxyActivities<Activities>({ ...PROVIDER_CALL, ...options, taskQueue: workflowInfo().taskQueue });
  }

  private set(patch: Partial<ExecutionResourceRecord>): void {
    Object.assign(this.record, patch);
    this.onChange();
  }

  async provision(start: boolean): Promise<void> {
    this.set({ state: 'PROVISIONING', fence: this.record.fence + 1 });
    const result = await this.onAnyHost().provisionSandbox({
      ...this.owner,
      start,
      request: {
        sandboxId: this.record.sandboxId,
        fence: this.record.fence,
        ...(this.binding.template ? { template: this.binding.template } : {}),
        ...(this.binding.env ? { env: this.binding.env } : {}),
        workspace: this.binding.workspace,
        ...(this.binding.limits ? { limits: this.binding.limits } : {}),
      },
    });
    this.capabilities = result.capabilities;
    // Absent from a worker of an earlier version: unknown, so the Run asks with its first delivery.
    if (result.webhooks !== undefined) this.webhooks = result.webhooks;
    this.set({ state: 'ACTIVE', hostId: result.hostId });
  }

  /** A fenced provider call on the sandbox's host; destroy goes through destroy(). */
  async op(op: Exclude<ProviderOp, 'destroy'>): Promise<void> {
    await this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT }).sandboxOp({
      ...this.owner,
      op,
      request: { sandboxId: this.record.sandboxId, fence: this.record.fence },
    });
  }

  async exec(
    jobId: string,
    command: string,
    options: { timeoutMs?: number; env?: Record<string, string>; keepOutput?: false } = {},
  ): Promise<ExecOutcome> {
    const { keepOutput, ...request } = options;
    return this.onHost({
      scheduleToStartTimeout: HOST_BUSY_LIMIT,
      // Retried like any provider call (an attempt lost on the way shows up as a heartbeat timeout):
      // the provider's job journal never runs a command twice (a started, unfinished job is JOB_INTERRUPTED).
      summary: `exec ${command.slice(0, 60)}`,
    }).execInSandbox({
      ...this.owner,
      request: { sandboxId: this.record.sandboxId, fence: this.record.fence, jobId, command, ...request },
      // A job whose output its owner throws away: the activity's result (in the history) carries none.
      ...(keepOutput === false ? { keepOutput } : {}),
    });
  }

  async readFile(path: string, encoding: FileEncoding): Promise<string> {
    const out = await this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT }).readSandboxFile({
      ...this.owner,
      sandboxId: this.record.sandboxId,
      fence: this.record.fence,
      path,
      encoding,
    });
    return out.content;
  }

  async writeFile(path: string, content: string, encoding: FileEncoding): Promise<void> {
    await this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT }).writeSandboxFile({
      ...this.owner,
      sandboxId: this.record.sandboxId,
      fence: this.record.fence,
      path,
      content,
      encoding,
    });
  }

  /**
   * Starts releasing compute in its own cancellable scope: waits while `isBlocked`
   * (RELEASE_BLOCKED), then calls release with the fence and idempotency key,
   * retried by Temporal from 1 s to 5 min with no attempt limit.
   */
  startRelease(mode: PauseMode, reason: string, labels: Record<string, string>, isBlocked: () => boolean): void {
    const scope = new CancellationScope();
    this.releaseScope = scope;
    this.releaseFailure = undefined;
    this.releasing = scope
      .run(async () => {
        if (isBlocked()) {
          this.set({ state: 'RELEASE_BLOCKED', blockedSince: nowIso(), pauseMode: mode });
          await condition(() => !isBlocked());
        }
        this.set({ state: 'RELEASING', blockedSince: undefined, pauseMode: mode, lastError: undefined });
        const receipt = await this.onHost({
          retry: RELEASE_RETRY,
          summary: `release ${mode} fence ${this.record.fence}`,
        }).releaseSandbox({
          ...this.owner,
          labels,
          request: {
            sandboxId: this.record.sandboxId,
            idempotencyKey: releaseIdempotencyKey(this.binding.ownerId, this.record.sandboxId, this.record.fence),
            mode,
            fence: this.record.fence,
            reason,
          },
        });
        this.set({
          state: 'RELEASED',
          attempts: receipt.attempt,
          releasedAt: receipt.releasedAt,
          ...(receipt.checkpoint ? { checkpoint: receipt.checkpoint } : {}),
        });
      })
      .catch((err: unknown) => {
        const honest = this.isPatched(PATCH_RELEASE_OUTCOME);
        if (isCancellation(err)) {
          // Cancelled before its receipt: nothing was released, the compute still runs.
          if (honest && (this.record.state === 'RELEASING' || this.record.state === 'RELEASE_BLOCKED')) {
            this.set({ state: 'ACTIVE', blockedSince: undefined });
          }
          return;
        }
        // Only non-retryable failures get here (e.g. STALE_FENCE), refused before anything was
        // released: the compute still runs, and the record says so.
        if (honest) {
          this.releaseFailure = err;
          this.set({ state: 'ACTIVE', blockedSince: undefined, lastError: failureMessage(err) });
        } else {
          this.set({ lastError: failureMessage(err) });
        }
      })
      .finally(() => {
        if (this.releaseScope === scope) this.releaseScope = undefined;
      });
  }

  get releaseInFlight(): boolean {
    return this.releaseScope !== undefined;
  }

  /** Waits for the release started last to settle. */
  async settleRelease(): Promise<void> {
    await this.releasing;
  }

  /** Cancels an in-flight release and waits until the activity has stopped. */
  async cancelRelease(): Promise<void> {
    this.releaseScope?.cancel();
    await this.releasing;
  }

  /** Release and wait for the receipt (used by cancel, TTL and hash mismatch). */
  async releaseNow(mode: PauseMode, reason: string, labels: Record<string, string>): Promise<void> {
    this.startRelease(mode, reason, labels, () => false);
    await this.settleRelease();
  }

  /** Release under a fence of its own, so no earlier release attempt can land after it. */
  async releaseUnderNewFence(mode: PauseMode, reason: string, labels: Record<string, string>): Promise<void> {
    this.record.fence += 1;
    await this.releaseNow(mode, reason, labels);
  }

  /** No advertised pause mode is safe: the sandbox is kept as it is (RETAINED). */
  retain(why: string): void {
    this.set({ state: 'RETAINED', lastError: `retained: ${why}` });
  }

  /** Records what went wrong with the sandbox last (a cleanup that failed). */
  noteError(message: string): void {
    this.record.lastError = message;
  }

  /**
   * Brings the sandbox back under a new fence: re-attach a live or detached one,
   * re-provision compute on a host-persistent workspace, or restore a checkpoint —
   * on its original host when that host answers, otherwise on any host.
   */
  async resume(start?: ResumeStart): Promise<RestoreResult | undefined> {
    return this.resuming(start ?? (await this.beginResume()), async (plan) => {
      const restored = await this.bringBack(plan);
      this.set({ state: 'ACTIVE', releasedAt: undefined });
      return restored;
    });
  }

  /**
   * resume() and then the job `jobId`, in one activity on the host that brings the sandbox back
   * (resumeAndExecInSandbox). The job runs only if the restored checkpoint was recorded under
   * `expect` (no outcome otherwise). A failure before the sandbox was back rolls the record back as
   * resume() does; one after it (the job's own) leaves the record ACTIVE and is rethrown.
   */
  async resumeAndExec(
    start: ResumeStart,
    jobId: string,
    command: string,
    expect: Hashes,
    options: { timeoutMs?: number } = {},
    /** Called once the activity has succeeded, before the record changes. */
    onBack: () => void = () => undefined,
  ): Promise<{ restored?: RestoreResult; outcome?: ExecOutcome }> {
    return this.resuming(start, async (plan) => {
      const exec = (bringBack: BringBack) => (activities: Activities) =>
        activities.resumeAndExecInSandbox({
          ...this.owner,
          bringBack,
          expect,
          request: { sandboxId: this.record.sandboxId, fence: this.record.fence, jobId, command, ...options },
        });
      let result: ResumedExec;
      try {
        if (plan.kind === 'attach') {
          result = await exec({
            op: 'attach',
            request: { sandboxId: this.record.sandboxId, fence: this.record.fence },
          })(this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT, summary: `resume+exec ${command.slice(0, 50)}` }));
        } else {
          const run = exec({ op: 'restore', request: this.restoreRequest() });
          result = await this.onRestoreHost(plan, run, `resume+exec ${command.slice(0, 50)}`);
        }
      } catch (err) {
        const back = resumedThenFailed(err);
        if (!back) throw err;
        // The sandbox is back under the new fence; only the job failed.
        this.capabilities = back.capabilities;
        this.set({ state: 'ACTIVE', releasedAt: undefined, hostId: back.hostId });
        throw new JobFailedAfterResume(err);
      }
      onBack();
      this.capabilities = result.resumed.capabilities;
      this.set({ state: 'ACTIVE', releasedAt: undefined, hostId: result.resumed.hostId });
      const restored = result.resumed.restored;
      return {
        ...(restored
          ? { restored: { source: restored.source, ...(restored.labels ? { labels: restored.labels } : {}) } }
          : {}),
        ...(result.outcome ? { outcome: result.outcome } : {}),
      };
    });
  }

  /**
   * The first half of a resume: the release cancelled, the fence raised, the record RESTORING. The
   * sandbox comes back in resume() or resumeAndExec() with the ResumeStart, or the resume is undone
   * (undoResume) if the owner ends before it.
   */
  async beginResume(): Promise<ResumeStart> {
    await this.cancelRelease();
    const plan = planResume(this.record);
    const before = this.record.state;
    this.set({ state: 'RESTORING', fence: this.record.fence + 1, lastError: undefined, blockedSince: undefined });
    return { plan, before };
  }

  /**
   * Finishes the resume a cancellation cut short, under the fence it raised (a provider takes a restore
   * retried at its fence as the same restore): the owner's end then releases a whole workspace, and
   * whatever the cut-short restore started ends with that release. Run in a non-cancellable scope.
   */
  async finishCutShortResume(): Promise<void> {
    const start = this.cutShort;
    if (!start) throw new Error(`cannot finish the resume of a record ${this.record.state}: none was cut short`);
    this.cutShort = undefined;
    await this.resume(start);
  }

  /** A begun resume that will not happen: the record says where the sandbox still is (its raised fence kept). */
  undoResume(start: ResumeStart): void {
    if (this.record.state === 'RESTORING') this.set({ state: start.before });
  }

  /** Brings the sandbox back with `bring`; a failure rolls the record back to where it was. */
  private async resuming<T>(start: ResumeStart, bring: (plan: ResumePlan) => Promise<T>): Promise<T> {
    const { plan, before } = start;
    try {
      if (plan.kind === 'none') throw new Error(`cannot resume: ${plan.why}`);
      return await bring(plan);
    } catch (err) {
      // Cut short, the resume may have brought compute back: the record stays RESTORING (the owner's end finishes it).
      if (isCancellation(err)) this.cutShort = start;
      // The sandbox stays where it was (its raised fence kept): a later resume tries again.
      if (!isCancellation(err) && !(err instanceof JobFailedAfterResume) && this.isPatched(PATCH_RESUME_ROLLBACK))
        this.set({ state: before, lastError: failureMessage(err) });
      throw err instanceof JobFailedAfterResume ? err.failure : err;
    }
  }

  private async bringBack(plan: ResumePlan): Promise<RestoreResult | undefined> {
    if (plan.kind === 'attach') {
      await this.op('attach');
      return undefined;
    }
    return this.onRestoreHost(plan, (activities) => this.restoreOn(activities));
  }

  /**
   * Runs a restore on the sandbox's host; a restore of a checkpoint that host has not taken within
   * HOST_SCHEDULE_TO_START goes to any host (unless the provider does not restore across hosts).
   */
  private async onRestoreHost<T>(
    plan: ResumePlan,
    restore: (activities: Activities) => Promise<T>,
    summary?: string,
  ): Promise<T> {
    const extra = summary ? { summary } : {};
    if (plan.kind === 'reprovision') return restore(this.onHost({ retry: RESTORE_RETRY, ...extra }));
    return restore(
      this.onHost({ scheduleToStartTimeout: HOST_SCHEDULE_TO_START, retry: RESTORE_RETRY, ...extra }),
    ).catch((err: unknown) => {
      if (!isScheduleToStartTimeout(err)) throw err;
      if (this.capabilities?.crossHostRestore === false && this.isPatched(PATCH_HOST_BOUND_RESTORE)) {
        // Restoring elsewhere would be a fake: this provider's checkpoints only come back where they were made.
        throw ApplicationFailure.create({
          type: 'UNAVAILABLE',
          message: `sandbox ${this.record.sandboxId} can only be restored on host ${this.record.hostId} (provider ${this.binding.provider} does not restore across hosts), and that host has not taken the restore for ${HOST_SCHEDULE_TO_START}; resume again once it is back`,
          nonRetryable: true,
        });
      }
      return restore(this.onAnyHost({ retry: RESTORE_RETRY, ...extra }));
    });
  }

  private restoreRequest() {
    return {
      sandboxId: this.record.sandboxId,
      fence: this.record.fence,
      ...(this.record.pauseMode === 'SNAPSHOT_AND_TERMINATE' && this.record.checkpoint
        ? { checkpoint: this.record.checkpoint }
        : {}),
      ...(this.binding.env ? { env: this.binding.env } : {}),
      workspace: this.binding.workspace,
      ...(this.binding.limits ? { limits: this.binding.limits } : {}),
    };
  }

  private async restoreOn(activities: Activities): Promise<RestoreResult> {
    const result = await activities.restoreSandbox({ ...this.owner, request: this.restoreRequest() });
    this.capabilities = result.capabilities;
    this.set({ hostId: result.hostId });
    return { source: result.source, ...(result.labels ? { labels: result.labels } : {}) };
  }

  /**
   * Destroys the sandbox and every checkpoint it ever had. The host gets a bounded try (a host
   * that is gone or keeps failing does not hold up the end); what it could not remove, its own
   * maintenance removes once it is back, since the record then says DESTROYED. The checkpoints
   * go with the host's destroy when its provider says so, else from any host, retried until done;
   * the record says DESTROYING until they are.
   */
  async destroy(): Promise<void> {
    const announce = this.record.state !== 'DESTROYED' && this.isPatched(PATCH_DESTROYING);
    if (announce) this.beginDestroy();
    await this.cancelRelease();
    if (this.record.state === 'DESTROYED') return;
    // A receipt may have landed before the cancel did: the record still says what is under way.
    if (announce) this.beginDestroy();
    const request = { sandboxId: this.record.sandboxId, fence: this.record.fence };
    if (!this.isPatched(PATCH_DESTROY_HANDOFF)) {
      await this.onHost().sandboxOp({ ...this.owner, op: 'destroy', request });
      this.set({ state: 'DESTROYED', blockedSince: undefined });
      return;
    }
    let hostProblem: string | undefined;
    // Decided by the destroy's result, which the history holds: null in histories recorded before the
    // provider said so, and in any destroy scheduled by code that did not ask (activities/provider.ts),
    // so replay takes the branch the recorded run took, without a patch marker.
    let checkpointsDeleted = false;
    try {
      const result = await this.onHost({ scheduleToStartTimeout: HOST_SCHEDULE_TO_START }).sandboxOp({
        ...this.owner,
        op: 'destroy',
        request,
        reportCheckpointsDeleted: true,
      });
      checkpointsDeleted = result?.checkpointsDeleted === true;
    } catch (err) {
      if (isCancellation(err)) throw err;
      hostProblem = `destroy on host ${this.record.hostId ?? '(none)'} did not finish (${failureMessage(err)}); that host's maintenance removes what is left`;
    }
    const destroyed: Partial<ExecutionResourceRecord> = {
      state: 'DESTROYED',
      blockedSince: undefined,
      ...(hostProblem ? { lastError: hostProblem } : {}),
    };
    // The host's destroy deleted them already: a second delete was an activity, a workflow task and
    // two S3 requests more at every end (issue 17).
    if (announce) {
      if (hostProblem) this.set({ lastError: hostProblem });
      if (!checkpointsDeleted) await this.deleteCheckpoints();
      this.set(destroyed);
      return;
    }
    this.set(destroyed);
    if (!checkpointsDeleted) await this.deleteCheckpoints();
  }

  /** The record says DESTROYING (it read ACTIVE once a release was cancelled, or what it was, while the host was waited for). */
  private beginDestroy(): void {
    const to = destroyingState(this.record.state);
    if (to) this.set({ state: to, blockedSince: undefined });
  }

  /**
   * Deletes every checkpoint of the sandbox (all fences), from any host, retried until done. It
   * heartbeats, so a worker lost mid-delete is retried after 30 s, not after the hour a sandbox of very
   * many packs may take (only the activity's options changed: the commands, and replay, are the same).
   */
  async deleteCheckpoints(): Promise<void> {
    await this.onAnyHost({
      retry: UNTIL_DONE,
      startToCloseTimeout: '1h',
    }).deleteSandboxCheckpoints({
      sandboxId: this.record.sandboxId,
    });
  }
}

/** A fused resume's job failed once the sandbox was back: not a failed resume, so nothing rolls back. */
class JobFailedAfterResume extends Error {
  constructor(readonly failure: unknown) {
    super(failureMessage(failure));
  }
}

/** Where the sandbox came back, when a fused resume failed only in its job (ResumedThenFailed details). */
function resumedThenFailed(err: unknown): ResumedThenFailed['resumedThenFailed'] | undefined {
  if (!(err instanceof ActivityFailure) || !(err.cause instanceof ApplicationFailure)) return undefined;
  const details = err.cause.details?.[0] as Partial<ResumedThenFailed> | undefined;
  return details?.resumedThenFailed;
}

export function isScheduleToStartTimeout(err: unknown): boolean {
  return (
    err instanceof ActivityFailure &&
    err.cause instanceof TimeoutFailure &&
    err.cause.timeoutType === TimeoutType.SCHEDULE_TO_START
  );
}
