import { ApplicationFailure, CancellationScope, getExternalWorkflowHandle, log, proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';
import { computeRunHashes } from '../common/hashes';
import { ExecutionBindingLifecycleCoordinator, failureMessage } from './coordinator';
import { childStateSignal, type RunWorkflowInput } from './definitions';
import { admitRunOp, isRejection, nextRunState, type RunEvent, type RunOp, type Rejection } from './lifecycle';
import type { SessionAggregate } from './run-state';
import { Publisher } from './visibility';

/** Host-independent activities of a Run (agent steps, external jobs, checkpoint deletion). */
export const shared = proxyActivities<Activities>({
  startToCloseTimeout: '10m',
  heartbeatTimeout: '1m',
  retry: { initialInterval: '1s', maximumInterval: '1m', maximumAttempts: 10, nonRetryableErrorTypes: ['NOT_FOUND', 'INVALID_ARGUMENT'] },
});

// Changes to the Run's command sequence, each behind its patch so recorded histories replay.
export const PATCH_CHILDREN_SURVIVE_CAN = 'stasis-run-children-survive-can';
export const PATCH_CHILD_CLOSED_UNREPORTED = 'stasis-run-child-closed-unreported';
export const PATCH_IDLE_ATTACH = 'stasis-run-idle-attach';
export const PATCH_KEEP_RETAINED = 'stasis-run-keep-retained';
export const PATCH_EXPIRY_FIRST = 'stasis-run-expiry-first';
export const PATCH_RECORDED_HASHES = 'stasis-run-recorded-hashes';

/**
 * One Run's in-memory owner: its aggregate, the coordinator of its sandbox, and the
 * flags of requests not yet taken up. Status and phase change only in transition().
 */
export class RunController {
  readonly run: SessionAggregate;
  readonly sandbox: ExecutionBindingLifecycleCoordinator;
  manualSuspendRequested = false;
  resumeRequested = false;
  ttlExpired = false;
  /** Retention ran out and the Run is settling its expiry: answers are stale from here on. */
  expiring = false;
  readonly jobScopes = new Map<string, CancellationScope>();
  /** Set by the `complete` action; the Run is COMPLETED once finish() has settled everything. */
  completed?: { output: unknown };
  reporting: Promise<void> = Promise.resolve();
  /** Children started by this workflow run, whose close it learns from their handles. */
  readonly watchedChildren = new Set<string>();
  private lastReportedState?: string;
  private readonly publisher = new Publisher();

  constructor(input: RunWorkflowInput, workflowId: string) {
    this.run = input.carried ?? newAggregate(workflowId, input);
    this.sandbox = new ExecutionBindingLifecycleCoordinator(
      this.run.record,
      {
        ownerId: this.run.runId,
        provider: this.run.spec.sandbox.provider,
        ...(this.run.spec.sandbox.template ? { template: this.run.spec.sandbox.template } : {}),
        ...(this.run.spec.sandbox.env ? { env: this.run.spec.sandbox.env } : {}),
        workspace: this.run.spec.sandbox.workspace ?? { kind: 'isolated' },
        ...(this.run.spec.sandbox.limits ? { limits: this.run.spec.sandbox.limits } : {}),
      },
      () => this.changed(),
    );
    if (this.run.capabilities) this.sandbox.capabilities = this.run.capabilities;
  }

  /**
   * The one place a Run's status and phase change (RUN_TRANSITIONS); publishes the
   * change. An illegal transition is a bug: it fails the workflow task loudly.
   */
  transition(event: RunEvent): void {
    const next = nextRunState(this.run, event);
    if (isRejection(next)) throw new Error(next.message);
    this.run.status = next.status;
    this.run.phase = next.phase;
    if (next.phase === 'ACTIVE') this.run.suspension = undefined;
    this.changed();
  }

  /** Whether `op` is admitted now (the rules of admitRunOp over this Run's facts). */
  admit(op: RunOp): Rejection | undefined {
    return admitRunOp(
      {
        status: this.run.status,
        phase: this.run.phase,
        suspendRequested: this.manualSuspendRequested,
        ...(this.run.suspension ? { suspensionReason: this.run.suspension.reason } : {}),
        expiring: this.expiring,
        runningJobs: this.run.jobs.filter((j) => j.status === 'running').length,
      },
      op,
    );
  }

  /** Keeps Temporal Web and the parent Run current after every change. */
  changed(): void {
    this.publisher.run(this.run);
    const report = `${this.run.record.state}/${this.run.status}`;
    if (this.run.parentRunId && report !== this.lastReportedState) {
      this.lastReportedState = report;
      const parent = getExternalWorkflowHandle(this.run.parentRunId);
      const message = { runId: this.run.runId, state: this.run.record.state, status: this.run.status };
      // Chained so reports arrive in order; awaited before the Run closes so the last one is delivered.
      this.reporting = this.reporting
        .then(() => parent.signal(childStateSignal, message))
        .catch((err: unknown) => log.warn('could not report to parent', { error: failureMessage(err) }));
    }
  }

  /** A child closed without its final report: it settles as FAILED and blocks nothing. */
  childClosedUnreported(childId: string, why: string): void {
    const child = this.run.children.find((ch) => ch.runId === childId);
    if (!child || child.closed) return;
    child.closed = why;
    this.run.childStatus[childId] = 'FAILED';
    this.changed();
  }

  /** What a checkpoint of this Run is labelled with, checked again when it is resumed. */
  labels(): Record<string, string> {
    return { runhash: this.run.hashes.run, spechash: this.run.hashes.spec, policyhash: this.run.hashes.policy };
  }
}

/** A refusal as the failure an Update validator throws. */
export function refuse(rejection: Rejection): never {
  throw ApplicationFailure.create({ type: rejection.code, message: rejection.message, nonRetryable: true });
}

function newAggregate(workflowId: string, input: RunWorkflowInput): SessionAggregate {
  const hashes = computeRunHashes(workflowId, input.spec, input.parentRunId);
  return {
    runId: workflowId,
    spec: input.spec,
    ...(input.parentRunId ? { parentRunId: input.parentRunId } : {}),
    hashes,
    status: 'RUNNING',
    phase: 'ACTIVE',
    interactions: [],
    answeredBy: {},
    checkpoint: { state: undefined, stepIndex: 0, hashes },
    record: {
      sandboxId: `${workflowId}-sbx`.replace(/[^A-Za-z0-9._-]/g, '-'),
      provider: input.spec.sandbox.provider,
      state: 'PROVISIONING',
      fence: 0,
      attempts: 0,
    },
    jobs: [],
    children: [],
    childStatus: {},
    jobCounter: 0,
  };
}
