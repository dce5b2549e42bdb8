import {
  CancellationScope,
  getExternalWorkflowHandle,
  log,
  patched,
  proxyActivities,
  proxyLocalActivities,
} from '@temporalio/workflow';
import type { Activities } from '../activities';
import { computeRunHashes } from '../common/hashes';
import { RUN_SANDBOX_SUFFIX } from '../common/wire-checks';
import type { Hashes } from '../common/schemas';
import { nonRetryableErrorTypes, type Rejection } from '../common/errors';
import {
  ExecutionBindingLifecycleCoordinator,
  PATCH_DESTROY_HANDOFF,
  PATCH_DESTROYING,
  PATCH_HOST_BOUND_RESTORE,
  PATCH_RELEASE_OUTCOME,
  PATCH_RESUME_ROLLBACK,
  type ResumeStart,
} from './coordinator';
import { failureMessage } from './failures';
import { childStateSignal, type RunWorkflowInput } from './definitions';
import { admitRunOp, isRejection, nextRunState, type RunEvent, type RunOp } from './lifecycle';
import { takeUp, type SessionAggregate } from './run-state';
import { PATCH_MEMO_FITS, PATCH_ONE_UPSERT, PATCH_PENDING_MEMO, Publisher } from './visibility';
import {
  PATCH_WEBHOOK_INPUT_FITS,
  PATCH_WEBHOOK_WORKFLOWS,
  PATCH_WEBHOOKS,
  PATCH_WEBHOOKS_KNOWN,
} from './run-webhooks';
import { PATCH_RESULT_BYTES } from './run-external';

/** Host-independent activities of a Run (agent steps, external jobs, checkpoint deletion). */
export const shared = proxyActivities<Activities>({
  startToCloseTimeout: '10m',
  heartbeatTimeout: '1m',
  retry: {
    initialInterval: '1s',
    maximumInterval: '1m',
    maximumAttempts: 10,
    nonRetryableErrorTypes: nonRetryableErrorTypes(),
  },
});

/**
 * Steps of a driver that answers at once from its input (scripted): a local activity, one marker in
 * the history instead of three events and a workflow task.
 */
const localSteps = proxyLocalActivities<Pick<Activities, 'agentStep'>>({
  startToCloseTimeout: '30s',
  retry: {
    initialInterval: '1s',
    maximumInterval: '10s',
    maximumAttempts: 10,
    nonRetryableErrorTypes: nonRetryableErrorTypes(),
  },
});
/** Drivers whose step is a pure function of its input, run as local activities. */
const FAST_DRIVERS = ['scripted'];

// Changes to the Run's command sequence, each behind its patch so recorded histories replay.
export const PATCH_LOCAL_STEPS = 'stasis-run-local-steps';
export const PATCH_REMOTE_STEPS = 'stasis-run-remote-steps';
export const PATCH_CHILDREN_SURVIVE_CAN = 'stasis-run-children-survive-can';
export const PATCH_CHILD_CLOSED_UNREPORTED = 'stasis-run-child-closed-unreported';
export const PATCH_IDLE_ATTACH = 'stasis-run-idle-attach';
export const PATCH_KEEP_RETAINED = 'stasis-run-keep-retained';
export const PATCH_EXPIRY_FIRST = 'stasis-run-expiry-first';
export const PATCH_RECORDED_HASHES = 'stasis-run-recorded-hashes';
/** An ask's result is the answer with its interaction id and who gave it, not the bare response. */
export const PATCH_ANSWER_RESULT = 'stasis-run-answer-result';
export const PATCH_EXPIRY_DESTROYS = 'stasis-run-expiry-destroys';
/**
 * Fewer history events per suspend/resume cycle: a resume whose next action is a sandbox job runs
 * with it in one activity (resumeAndExecInSandbox), and one retention timer serves every
 * suspension until it fires, instead of a timer started and cancelled per suspension.
 */
export const PATCH_LEAN_CYCLE = 'stasis-run-lean-cycle';
/**
 * The `resume` Update answers once the resume is taken (the sandbox is back, or comes back with the
 * next action), not once the Run is ACTIVE: a deferred resume followed by an ask or a hold is ACTIVE
 * only within one workflow task, so the Update waited forever.
 */
export const PATCH_RESUME_TAKEN = 'stasis-run-resume-taken';
/**
 * A deferred resume whose next action is an ask or a hold that would release the sandbox as it is
 * already released is skipped: the Run goes into its new suspension with no restore and no release.
 */
export const PATCH_STAY_RELEASED = 'stasis-run-stay-released';
/**
 * A Run told to continue as new with a resume deferred to its next action brings its sandbox back
 * first: continue-as-new waits for an ACTIVE Run, and one that only asks is RESUMING between all its
 * steps, so it never continued as new and its history grew until Temporal ended it.
 */
export const PATCH_CAN_BRINGS_BACK = 'stasis-run-can-brings-back';
/**
 * Continue-as-new gives way to a suspend asked for while it waited (for the sandbox to come back, for
 * handlers, for webhook deliveries): it waited for the suspend's handler, which waited for the Run to
 * suspend, so neither ever happened and the Run held its compute for good.
 */
export const PATCH_CAN_YIELDS_TO_SUSPEND = 'stasis-run-can-yields-to-suspend';

/**
 * A Run that ends cancelled (or failed) with a resume cut short finishes that resume, then releases the
 * sandbox: the record stayed RESTORING for good, and what the restore had started kept running.
 * In PATCH_RUN_BASELINE_3; a Run started before asks for it only when its end meets such a record.
 */
export const PATCH_END_FINISHES_RESUME = 'stasis-run-end-finishes-resume';
/**
 * A Run that ends cancelled (or failed) while its sandbox is still being provisioned destroys it: the
 * record stayed PROVISIONING (no capabilities learnt, so no pause mode chosen) and the sandbox's processes
 * kept running, reaped by no host. In PATCH_RUN_BASELINE_3, as PATCH_END_FINISHES_RESUME.
 */
export const PATCH_END_DESTROYS_PROVISIONING = 'stasis-run-end-destroys-provisioning';
/** A completed Run's destroy is not cancelled by a cancel or a ttl that comes while it runs (run-ending.ts). */
export const PATCH_UNCANCELLED_DESTROY = 'stasis-run-uncancelled-destroy';
/** A Run that ends on a DETACH hold releases the compute it left running, with a snapshot (run-ending.ts). */
export const PATCH_RELEASE_DETACHED = 'stasis-run-release-detached';
/**
 * A Run its agent fails keeps its workspace (compute released), as one failed by an error does; its
 * sandbox is not brought back first. It was brought back and destroyed, checkpoints and all.
 */
export const PATCH_FAILED_KEEPS = 'stasis-run-failed-keeps';
/**
 * A child whose Run has ended blocks neither its parent's completion nor its release (blockingChildren):
 * one that ended with its record kept ACTIVE or RETAINED held the parent for good.
 */
export const PATCH_ENDED_CHILDREN = 'stasis-run-ended-children';
/**
 * A finishing parent waits for children it watches with no timer, and pings unwatched ones backed off
 * (childPingDelayMs): a 30 s ping grew its history until Temporal terminated it.
 */
export const PATCH_QUIET_CHILD_WAIT = 'stasis-run-quiet-child-wait';
/** A Run its agent fails cancels its live children, as one that fails by an error or is cancelled does. */
export const PATCH_FAILED_CANCELS_CHILDREN = 'stasis-run-failed-cancels-children';
/**
 * Continue-as-new's input is kept within CARRIED_INPUT_MAX_BYTES (fitContinueInput, run-state.ts): over
 * Temporal's 2 MiB limit, Temporal terminated the Run (BadContinueAsNewAttributes) and left its sandbox
 * behind. A Run whose minimum does not fit either performs the action it was sent first (its body is
 * then dropped) and continues as new after it, or, with none, fails with STATE_TOO_LARGE (its compute
 * released, its workspace kept, as any failed Run). In PATCH_RUN_BASELINE_4; a Run started before asks only when the input as Runs before carried
 * it is over the bound, so other Runs record nothing new.
 */
export const PATCH_CARRIED_FITS = 'stasis-run-carried-fits';
/**
 * A child id the spawn does not give is at most RUN_ID_MAX characters (childRunId); Runs before
 * this gave longer ones (unaddressable). In PATCH_RUN_BASELINE_4; a Run started before asks only when the two differ, so other spawns record nothing.
 */
export const PATCH_CHILD_ID_FITS = 'stasis-run-child-id-fits';
/**
 * The respond Update's result (the answered interaction, with the Run's labels) is kept within
 * INTERACTION_PAYLOAD_MAX_BYTES: past it, without its bulk and labels (forgetContent). Before, labels,
 * a reviewed command and an input answer of 900 KB each made a result Temporal refused, and it
 * terminated the Run. In PATCH_RUN_BASELINE_4; a Run started before asks only when the result is over the bound.
 */
export const PATCH_RESPOND_RESULT_FITS = 'stasis-run-respond-result-fits';
/**
 * A suspend or resume Update's result (the Run's snapshot) is kept within
 * INTERACTION_PAYLOAD_MAX_BYTES (fitSnapshotResult): a hundred answered asks of control characters made
 * one Temporal refused. In PATCH_RUN_BASELINE_4; a Run started before asks only when it is over the bound.
 */
export const PATCH_SNAPSHOT_RESULT_FITS = 'stasis-run-snapshot-result-fits';

/**
 * A Run keeps room in its history for what its running jobs and children may still add
 * (RUN_ITEM_HISTORY_MAX_BYTES each, waitsForJobs in lifecycle.ts): it takes no further agent step while
 * its history and that room reach the high-water mark, until one of them ends. Before, 36 background
 * jobs, or 27 children, ending together added 50 MB and Temporal terminated the Run. (A background job's
 * activity returns no output, keepOutput false, with no patch: an activity's input is not replayed.) In
 * PATCH_RUN_BASELINE_4; a Run started before asks only when it would wait under this rule.
 */
export const PATCH_RESERVES_ROOM = 'stasis-run-reserves-room';

/**
 * A Run started with this marker has every change of runBaseline() from its start, without a marker
 * of each, and takes a fast driver's steps as local activities.
 *
 * Why: a patch first asked for after a local activity breaks replay. A query that reaches the Run
 * while a local step runs makes Temporal end that workflow task early and hand the step's result to
 * the next one; replay hands it over in the first, before it has seen the next task's markers, so
 * patched() answers false there and the marker that follows is a nondeterminism error: the Run
 * stalled for good once its worker replayed it (an evicted Run that is answered). Decided in the
 * first activation, the baseline is known to replay from the start.
 *
 * A patch added later is not in the baseline (a Run started before it would take it on replay):
 * it goes in ASKED_AT_START.
 */
export const PATCH_RUN_BASELINE = 'stasis-run-baseline-1';

/**
 * Changes to Run code made after the first baseline: asked for in the first activation of a Run
 * started without PATCH_RUN_BASELINE_2 (one marker each), so replay knows them wherever the Run asks
 * again. A Run started before one of them finds no marker at its start and answers as it did when it
 * ran. Fixed: new Run patches go in ASKED_AT_START_2.
 */
const ASKED_AT_START: string[] = [
  PATCH_DESTROYING,
  PATCH_LEAN_CYCLE,
  PATCH_RESUME_TAKEN,
  PATCH_STAY_RELEASED,
  PATCH_CAN_BRINGS_BACK,
  PATCH_WEBHOOKS_KNOWN,
];

/**
 * A Run started with this marker has every change of the first baseline, of ASKED_AT_START and
 * PATCH_ONE_UPSERT from its start (runBaseline2()), with one marker instead of eight.
 *
 * Why: each marker comes with an upsert of TemporalChangeVersion (the SDK adds it), a history event
 * and a visibility write on the server for every Run started; eight of them were a share of the
 * server's work per cycle that a bare workflow does not have (issue 17).
 */
export const PATCH_RUN_BASELINE_2 = 'stasis-run-baseline-2';

/**
 * Changes to Run code made after PATCH_RUN_BASELINE_2: asked for in the first activation of a Run
 * started without PATCH_RUN_BASELINE_3, as ASKED_AT_START were. Fixed: new Run patches go in
 * ASKED_AT_START_4.
 */
const ASKED_AT_START_2: string[] = [PATCH_CAN_YIELDS_TO_SUSPEND, PATCH_WEBHOOK_WORKFLOWS];

/**
 * Changes to Run code made after PATCH_RUN_BASELINE_4: asked for in every Run's first activation
 * (one marker each for a new Run). Add each new Run patch here; fold them into a next baseline
 * when there are several. (Nothing was asked after PATCH_RUN_BASELINE_3 before the fourth.)
 */
const ASKED_AT_START_4: string[] = [];

/**
 * A Run started with this marker has every change of the second baseline and those of runBaseline3()
 * from its start, with one marker (as PATCH_RUN_BASELINE_2, for issue 17). Why a third: the changes to how a Run ends are asked for after a
 * local step (the agent's `complete` or `fail`), where a first patch() breaks replay (see
 * PATCH_RUN_BASELINE), and ASKED_AT_START_2 would cost every new Run a marker each.
 */
export const PATCH_RUN_BASELINE_3 = 'stasis-run-baseline-3';

/**
 * A Run started with this marker has every change of the third baseline and those of runBaseline4()
 * from its start, with one marker. Why a fourth: the changes that keep a Run's payloads within
 * Temporal's limits are asked for only on the path that needs them, which can come right after a
 * local step (continue-as-new, a spawn), where a first patch() breaks replay (see PATCH_RUN_BASELINE).
 */
export const PATCH_RUN_BASELINE_4 = 'stasis-run-baseline-4';

/** The changes a Run started with PATCH_RUN_BASELINE has from its start. Fixed: never add to it. */
function runBaseline(): string[] {
  return [
    PATCH_CHILDREN_SURVIVE_CAN,
    PATCH_CHILD_CLOSED_UNREPORTED,
    PATCH_IDLE_ATTACH,
    PATCH_KEEP_RETAINED,
    PATCH_EXPIRY_FIRST,
    PATCH_RECORDED_HASHES,
    PATCH_ANSWER_RESULT,
    PATCH_EXPIRY_DESTROYS,
    PATCH_WEBHOOKS,
    PATCH_PENDING_MEMO,
    PATCH_RESUME_ROLLBACK,
    PATCH_RELEASE_OUTCOME,
    PATCH_HOST_BOUND_RESTORE,
    PATCH_DESTROY_HANDOFF,
  ];
}

/** The changes a Run started with PATCH_RUN_BASELINE_2 has from its start. Fixed: never add to it. */
function runBaseline2(): string[] {
  return [...runBaseline(), ...ASKED_AT_START, PATCH_ONE_UPSERT];
}

/** The changes a Run started with PATCH_RUN_BASELINE_3 has from its start. Fixed: never add to it. */
function runBaseline3(): string[] {
  return [
    ...runBaseline2(),
    ...ASKED_AT_START_2,
    PATCH_UNCANCELLED_DESTROY,
    PATCH_RELEASE_DETACHED,
    PATCH_FAILED_KEEPS,
    PATCH_ENDED_CHILDREN,
    PATCH_QUIET_CHILD_WAIT,
    PATCH_FAILED_CANCELS_CHILDREN,
    PATCH_END_FINISHES_RESUME,
    PATCH_END_DESTROYS_PROVISIONING,
  ];
}

/** The changes a Run started with PATCH_RUN_BASELINE_4 has from its start. Fixed once released: never add to it then. */
function runBaseline4(): string[] {
  return [
    ...runBaseline3(),
    PATCH_CARRIED_FITS,
    PATCH_CHILD_ID_FITS,
    PATCH_RESPOND_RESULT_FITS,
    PATCH_RESULT_BYTES,
    PATCH_SNAPSHOT_RESULT_FITS,
    PATCH_WEBHOOK_INPUT_FITS,
    PATCH_MEMO_FITS,
    PATCH_RESERVES_ROOM,
  ];
}

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
  /** Children started by this workflow run whose result has not reached its history (PATCH_RESERVES_ROOM). */
  readonly childResultsDue = new Set<string>();
  /** Webhook deliveries not yet taken by the receiver (run-webhooks.ts). */
  readonly webhookDeliveries = new Set<Promise<void>>();
  /** Webhook delivery workflows not yet started (run-webhooks.ts, PATCH_WEBHOOK_WORKFLOWS). */
  readonly webhookStarts = new Set<Promise<void>>();
  /** The worker has no webhook: no more deliveries are started. */
  webhooksOff = false;
  /**
   * An answered suspension whose sandbox is not back yet: it comes back with the next sandbox job
   * (one activity), or before any other action (run-suspension.ts, PATCH_LEAN_CYCLE).
   */
  pendingResume?: { checkpointHashes: Hashes; start: ResumeStart };
  /**
   * Resumes taken: the sandbox came back, or its resume was deferred to the next action. The `resume`
   * Update answers once this counts past what it saw (PATCH_RESUME_TAKEN).
   */
  resumesTaken = 0;
  /**
   * Why the agent loop takes no step now, while it waits for a running job or child to end
   * (PATCH_RESERVES_ROOM); the resource view shows it. Not carried: it is over by then.
   */
  waitingFor?: string;
  /** Whether this Run's agent steps are local activities (resolved within the workflow task that asks). */
  readonly localSteps: boolean;
  /** Visibility changes wait for the local step under way (publishHeld), so its workflow task upserts once. */
  private holding = false;
  private held = false;
  /** The retention timer of this workflow run, kept across suspensions until it fires (PATCH_LEAN_CYCLE). */
  expiryTimer?: { atMs: number; fired: boolean };
  private lastReportedState?: string;
  /**
   * Decided in the Run's first activation (before its publisher asks for any patch). A Run started
   * with a later baseline asks for neither an earlier one nor the patches the later one holds.
   */
  private readonly baseline4 = patched(PATCH_RUN_BASELINE_4);
  private readonly baseline3 = this.baseline4 || patched(PATCH_RUN_BASELINE_3);
  private readonly baseline2 = this.baseline3 || patched(PATCH_RUN_BASELINE_2);
  private readonly baseline = this.baseline2 || patched(PATCH_RUN_BASELINE);
  /** patched() for this Run: true without a marker for a change of its baseline (PATCH_RUN_BASELINE, _2, _3, _4). */
  readonly patched = (patchId: string): boolean =>
    (this.baseline4 && runBaseline4().includes(patchId)) ||
    (this.baseline3 && runBaseline3().includes(patchId)) ||
    (this.baseline2 && runBaseline2().includes(patchId)) ||
    (this.baseline && runBaseline().includes(patchId)) ||
    patched(patchId);
  private readonly publisher = new Publisher(this.patched);
  /** Where this Run's agent steps run: decided once, at the start of each workflow run. */
  readonly steps: Pick<Activities, 'agentStep'>;

  constructor(input: RunWorkflowInput, workflowId: string) {
    this.run = input.carried ? takeUp(input.carried, input.spec) : newAggregate(workflowId, input);
    if (!this.baseline2) for (const patchId of ASKED_AT_START) patched(patchId);
    if (!this.baseline3) for (const patchId of ASKED_AT_START_2) patched(patchId);
    for (const patchId of ASKED_AT_START_4) patched(patchId);
    const fast = FAST_DRIVERS.includes(this.run.spec.agent.driver);
    // Runs started between the two markers took their steps as activities: local ones stalled a
    // polled Run until the baseline (PATCH_RUN_BASELINE) fixed why.
    this.steps = this.baseline
      ? fast
        ? localSteps
        : shared
      : patched(PATCH_REMOTE_STEPS)
        ? shared
        : fast && patched(PATCH_LOCAL_STEPS)
          ? localSteps
          : shared;
    this.localSteps = this.steps === localSteps;
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
      this.patched,
    );
    if (this.run.capabilities) this.sandbox.capabilities = this.run.capabilities;
    if (this.run.webhooks !== undefined) this.sandbox.webhooks = this.run.webhooks;
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

  /**
   * Holds visibility changes until publishHeld(): for a workflow task that goes on with a local step,
   * whose own changes are published when it resolves (one upsert for the task, not two).
   */
  holdPublishing(): void {
    this.holding = true;
  }

  /** Publishes what was held (holdPublishing), and stops holding. */
  publishHeld(): void {
    if (!this.holding) return;
    this.holding = false;
    if (this.held) this.publisher.run(this.run);
    this.held = false;
  }

  /** Keeps Temporal Web and the parent Run current after every change. */
  changed(): void {
    if (this.holding) this.held = true;
    else this.publisher.run(this.run);
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
      sandboxId: `${workflowId}${RUN_SANDBOX_SUFFIX}`.replace(/[^A-Za-z0-9._-]/g, '-'),
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
