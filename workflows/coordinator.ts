import {
  ActivityCancellationType,
  ActivityFailure,
  CancellationScope,
  TimeoutFailure,
  condition,
  isCancellation,
  proxyActivities,
  workflowInfo,
  type ActivityOptions,
} from '@temporalio/workflow';
import { TimeoutType } from '@temporalio/common';
import type { Activities } from '../activities';
import type { FileEncoding } from '../activities/provider';
import type { ExecOutcome } from '../providers/api';
import type { EnvMap, ExecutionResourceRecord, PauseMode, SandboxLimits, Workspace } from '../common/schemas';
import type { z } from 'zod';
import type { Capabilities, RestoreResult } from '../providers/api';
import { planResume, RELEASE_RETRY, releaseIdempotencyKey } from './lifecycle';
import { nowIso } from './clock';

// ExecutionBindingLifecycleCoordinator: the workflow-side owner of one
// ExecutionResourceRecord. It provisions, attaches, restores and releases the
// sandbox by calling provider activities on the host's own task queue.

const NON_RETRYABLE = [
  'STALE_FENCE',
  'IDEMPOTENCY_CONFLICT',
  'NOT_SUPPORTED',
  'INVALID_ARGUMENT',
  'NOT_FOUND',
  'CHECKPOINT_INVALID',
  'SANDBOX_FAILED',
  'INVALID_STATE_TRANSITION',
  'JOB_INTERRUPTED',
];

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
    nonRetryableErrorTypes: NON_RETRYABLE,
  },
  cancellationType: ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
};

/**
 * Restores (and re-provisions) wait out an unavailable object store or host the
 * way releases do: 1 s doubling to 5 min, no attempt limit. A store that is down
 * for minutes must not fail a Run whose checkpoint is safe; what no retry can
 * fix (NON_RETRYABLE: a missing or invalid checkpoint, a stale fence) still fails at once.
 */
const RESTORE_RETRY: ActivityOptions['retry'] = {
  initialInterval: '1s',
  backoffCoefficient: 2,
  maximumInterval: '5m',
  nonRetryableErrorTypes: NON_RETRYABLE,
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

export class ExecutionBindingLifecycleCoordinator {
  capabilities?: Capabilities;
  private releaseScope?: CancellationScope;
  private releasing?: Promise<void>;

  constructor(
    readonly record: ExecutionResourceRecord,
    private readonly binding: SandboxBinding,
    private readonly onChange: () => void,
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
    this.set({ state: 'ACTIVE', hostId: result.hostId });
  }

  async op(op: 'start' | 'stop' | 'pause' | 'resume' | 'attach'): Promise<void> {
    await this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT }).sandboxOp({
      ...this.owner,
      op,
      request: { sandboxId: this.record.sandboxId, fence: this.record.fence },
    });
  }

  async exec(
    jobId: string,
    command: string,
    options: { timeoutMs?: number; env?: Record<string, string> } = {},
  ): Promise<ExecOutcome> {
    return this.onHost({
      scheduleToStartTimeout: HOST_BUSY_LIMIT,
      // Retried like any provider call (an attempt lost on the way shows up as a heartbeat timeout):
      // the provider's job journal never runs a command twice (a started, unfinished job is JOB_INTERRUPTED).
      summary: `exec ${command.slice(0, 60)}`,
    }).execInSandbox({
      ...this.owner,
      request: { sandboxId: this.record.sandboxId, fence: this.record.fence, jobId, command, ...options },
    });
  }

  async readFile(path: string, encoding: FileEncoding): Promise<string> {
    const out = await this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT }).readSandboxFile({
      ...this.owner,
      sandboxId: this.record.sandboxId,
      path,
      encoding,
    });
    return out.content;
  }

  async writeFile(path: string, content: string, encoding: FileEncoding): Promise<void> {
    await this.onHost({ scheduleToStartTimeout: HOST_BUSY_LIMIT }).writeSandboxFile({
      ...this.owner,
      sandboxId: this.record.sandboxId,
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
    this.releasing = scope
      .run(async () => {
        if (isBlocked()) {
          this.set({ state: 'RELEASE_BLOCKED', blockedSince: nowIso(), pauseMode: mode });
          await condition(() => !isBlocked());
        }
        this.set({ state: 'RELEASING', blockedSince: undefined, pauseMode: mode, lastError: undefined });
        const receipt = await this.onHost({
          retry: { ...RELEASE_RETRY, nonRetryableErrorTypes: [...RELEASE_RETRY.nonRetryableErrorTypes] },
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
        if (isCancellation(err)) return;
        // Only non-retryable failures get here (e.g. STALE_FENCE): keep the record honest.
        this.set({ lastError: failureMessage(err) });
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

  /**
   * Brings the sandbox back under a new fence: re-attach a live or detached one,
   * re-provision compute on a host-persistent workspace, or restore a checkpoint —
   * on its original host when that host answers, otherwise on any host.
   */
  async resume(): Promise<RestoreResult | undefined> {
    await this.cancelRelease();
    const plan = planResume(this.record);
    this.set({ state: 'RESTORING', fence: this.record.fence + 1, lastError: undefined, blockedSince: undefined });
    let restored: RestoreResult | undefined;
    if (plan.kind === 'attach') {
      await this.op('attach');
    } else if (plan.kind === 'reprovision') {
      restored = await this.restoreOn(this.onHost({ retry: RESTORE_RETRY }));
    } else if (plan.kind === 'restore') {
      restored = await this.restoreOn(
        this.onHost({ scheduleToStartTimeout: HOST_SCHEDULE_TO_START, retry: RESTORE_RETRY }),
      ).catch((err: unknown) => {
        if (!isScheduleToStartTimeout(err)) throw err;
        return this.restoreOn(this.onAnyHost({ retry: RESTORE_RETRY }));
      });
    } else {
      throw new Error(`cannot resume: ${plan.why}`);
    }
    this.set({ state: 'ACTIVE', releasedAt: undefined });
    return restored;
  }

  private async restoreOn(activities: Activities): Promise<RestoreResult> {
    const result = await activities.restoreSandbox({
      ...this.owner,
      request: {
        sandboxId: this.record.sandboxId,
        fence: this.record.fence,
        ...(this.record.pauseMode === 'SNAPSHOT_AND_TERMINATE' && this.record.checkpoint
          ? { checkpoint: this.record.checkpoint }
          : {}),
        ...(this.binding.env ? { env: this.binding.env } : {}),
        workspace: this.binding.workspace,
        ...(this.binding.limits ? { limits: this.binding.limits } : {}),
      },
    });
    this.capabilities = result.capabilities;
    this.set({ hostId: result.hostId });
    return { source: result.source, ...(result.labels ? { labels: result.labels } : {}) };
  }

  async destroy(): Promise<void> {
    await this.cancelRelease();
    if (this.record.state === 'DESTROYED') return;
    await this.onHost().sandboxOp({
      ...this.owner,
      op: 'destroy',
      request: { sandboxId: this.record.sandboxId, fence: this.record.fence },
    });
    this.set({ state: 'DESTROYED', blockedSince: undefined });
  }
}

export function isScheduleToStartTimeout(err: unknown): boolean {
  return (
    err instanceof ActivityFailure &&
    err.cause instanceof TimeoutFailure &&
    err.cause.timeoutType === TimeoutType.SCHEDULE_TO_START
  );
}

/** The innermost message of a Temporal failure chain, after the activity it came from (a bare "Heartbeat timeout" names no culprit). */
export function failureMessage(err: unknown): string {
  let e: unknown = err;
  let activity: string | undefined;
  for (;;) {
    if (e instanceof ActivityFailure) activity ??= e.activityType;
    if (!(e instanceof Error && (e as { cause?: unknown }).cause instanceof Error)) break;
    e = (e as { cause: unknown }).cause;
  }
  const message = e instanceof Error ? e.message : String(e);
  return activity ? `${activity}: ${message}` : message;
}

/** The ApplicationFailure type (our error code) at the bottom of a failure chain, if any. */
export function failureCode(err: unknown): string | undefined {
  let e: unknown = err;
  let code: string | undefined;
  while (e instanceof Error) {
    const type = (e as { type?: unknown }).type;
    if (typeof type === 'string') code = type;
    e = (e as { cause?: unknown }).cause;
  }
  return code;
}
