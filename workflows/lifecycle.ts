// The lifecycle rules of Stasis as pure functions: which transitions are legal,
// which pause mode applies, whether release is blocked, what a receipt means,
// how a resume proceeds, which answers are accepted. Workflows are thin shells
// around these; every rule is unit-tested table by table without Temporal.
import { nonRetryableErrorTypes, type ErrorCode, type Rejection } from '../common/errors';
import { canonicalJson } from '../common/hashes';
import { answerProblem } from '../common/interactions';
import { RESOURCE_STATES } from '../common/wire-checks';
import type {
  ExecutionResourceRecord,
  Hashes,
  InteractionRequest,
  Job,
  PauseMode,
  ResourceState,
  RunPhase,
  RunStatus,
  SandboxState,
  SuspensionReason,
  Workspace,
} from '../common/schemas';

// ---------------------------------------------------------------- sandboxes

export type SandboxOp = 'start' | 'stop' | 'pause' | 'resume' | 'suspend' | 'destroy' | 'fail' | 'lose' | 'unsuspend';

/** Legal sandbox transitions (docs/DESIGN.md, Sandboxes). */
export const SANDBOX_TRANSITIONS: Record<SandboxOp, { from: SandboxState[]; to: SandboxState }> = {
  start: { from: ['created', 'stopped'], to: 'running' },
  stop: { from: ['running'], to: 'stopped' },
  pause: { from: ['running'], to: 'paused' },
  resume: { from: ['paused', 'suspended'], to: 'running' },
  suspend: { from: ['running'], to: 'suspended' },
  destroy: { from: ['created', 'running', 'stopped', 'paused', 'suspended', 'failed', 'lost'], to: 'destroyed' },
  /** Broken beyond repair while running, or never provisioned (its provisioning failed for good). */
  fail: { from: ['created', 'running'], to: 'failed' },
  lose: { from: ['running', 'paused'], to: 'lost' },
  /** A suspend answered before its release settled, whose release then failed for good: compute never left. */
  unsuspend: { from: ['suspended'], to: 'running' },
};

/** Operations that answer with the current state when already there (idempotent). */
const IDEMPOTENT_AT: Partial<Record<SandboxOp, SandboxState>> = { suspend: 'suspended', resume: 'running' };

export type SandboxDecision =
  { kind: 'transition'; to: SandboxState } | { kind: 'noop' } | { kind: 'reject'; rejection: Rejection };

export interface SandboxFacts {
  state: SandboxState;
  /** A state change is in progress: a second one gets 409 (one wins). */
  changing: boolean;
  /** Commands running now. */
  runningExecs: number;
  /** File reads and writes under way: like commands, they hold off a suspend. */
  fileOps: number;
  /** Retention expired: the sandbox's route is stale. */
  expired: boolean;
}

export const INVALID_TRANSITION: Rejection = {
  code: 'INVALID_STATE_TRANSITION',
  message: 'sandbox: invalid state transition',
};

export function decideSandboxOp(facts: SandboxFacts, op: SandboxOp): SandboxDecision {
  if (facts.state === 'destroyed') return reject('NOT_FOUND', 'sandbox: not found (destroyed)');
  if (facts.expired && op !== 'destroy') {
    return reject('STALE_SANDBOX_ROUTE', 'sandbox: suspended past retention; its route is stale');
  }
  if (facts.changing) return reject('INVALID_STATE_TRANSITION', 'sandbox: another state change is in progress');
  if (IDEMPOTENT_AT[op] === facts.state) return { kind: 'noop' };
  const rule = SANDBOX_TRANSITIONS[op];
  if (!rule.from.includes(facts.state)) return { kind: 'reject', rejection: INVALID_TRANSITION };
  if (op === 'suspend' && facts.runningExecs > 0) {
    return reject('SANDBOX_SUSPEND_BUSY', `sandbox: ${facts.runningExecs} command(s) running; suspend refused`);
  }
  // A write the snapshot might miss: refused rather than lost.
  if (op === 'suspend' && facts.fileOps > 0) {
    return reject('SANDBOX_SUSPEND_BUSY', `sandbox: ${facts.fileOps} file operation(s) under way; suspend refused`);
  }
  return { kind: 'transition', to: rule.to };
}

/** Exec is admitted on the same facts that suspend decides on. */
export function decideExec(facts: SandboxFacts): Rejection | undefined {
  if (facts.state === 'destroyed') return { code: 'NOT_FOUND', message: 'sandbox: not found (destroyed)' };
  if (facts.expired)
    return { code: 'STALE_SANDBOX_ROUTE', message: 'sandbox: suspended past retention; its route is stale' };
  if (facts.changing) return { code: 'INVALID_STATE_TRANSITION', message: 'sandbox: a state change is in progress' };
  if (facts.state !== 'running') {
    return { code: 'INVALID_STATE_TRANSITION', message: `sandbox: cannot exec while ${facts.state}` };
  }
  return undefined;
}

/** File access needs a workspace on a host: not after release or destroy. */
export function decideFileAccess(facts: SandboxFacts): Rejection | undefined {
  if (facts.state === 'destroyed') return { code: 'NOT_FOUND', message: 'sandbox: not found (destroyed)' };
  if (facts.expired)
    return { code: 'STALE_SANDBOX_ROUTE', message: 'sandbox: suspended past retention; its route is stale' };
  if (facts.state === 'suspended' || facts.state === 'lost' || facts.changing) {
    return {
      code: 'INVALID_STATE_TRANSITION',
      message: `sandbox: files are not reachable while ${facts.changing ? 'changing state' : facts.state}`,
    };
  }
  return undefined;
}

// ---------------------------------------------------------------- history room

/**
 * A sandbox workflow's history size (bytes) that calls under way may fill and no more (a server may
 * suggest continue-as-new late, or never): Temporal terminates a workflow whose history passes 50 MiB
 * (`limit.historySize.error`), and the 10 MiB left take the state changes, timers and ending.
 */
export const HISTORY_GUARD_BYTES = 40 * 1024 * 1024;

/**
 * The most one exec or file operation adds to a sandbox's history: its input (at most 1 MiB of JSON)
 * twice (the Update's request and the activity's input) and its result twice (the activity's and the
 * Update's): an exec's two streams of 128 KiB each, six bytes of JSON a byte of control characters.
 * A read's base64 content (1 MiB of file) twice, or a write's, is less.
 */
export const CALL_HISTORY_MAX_BYTES = 2 * 1024 * 1024 + 2 * 2 * 6 * 128 * 1024;

/** What a workflow task tells of the history (workflowInfo()), and what may still be added to it. */
export interface HistoryFacts {
  continueAsNewSuggested: boolean;
  historySizeBytes: number;
  /** Events so far (workflowInfo().historyLength). */
  historyLength: number;
  /** Execs and file operations under way: each may still add up to CALL_HISTORY_MAX_BYTES. */
  callsUnderWay: number;
}

/** Calls that may add up to CALL_HISTORY_MAX_BYTES each. */
const LARGE_CALLS: readonly SandboxCall[] = ['exec', 'readFile', 'writeFile'];

/** A caller's call of a standalone sandbox (one Update each). */
export type SandboxCall =
  'ready' | 'exec' | 'readFile' | 'writeFile' | Exclude<SandboxOp, 'fail' | 'lose' | 'unsuspend'>;

/**
 * Calls taken whatever the history: they end what keeps the sandbox from continuing as new, and each
 * is taken at most once before the state rules refuse the next. Stop ends its commands (a second stop
 * is refused from stopped); destroy ends everything; a resume of a suspended sandbox cancels a release
 * still under way (one whose host is gone retries for as long as it is gone) and leaves it running,
 * where a suspend is taken only once nothing is under way, so never before continuing as new.
 */
function takenWhateverTheHistory(call: SandboxCall, state: SandboxState): boolean {
  return call === 'stop' || call === 'destroy' || (call === 'resume' && state === 'suspended');
}

/** The history is full: no call but those taken whatever the history is taken (past the guard, or its events past theirs). */
const historyFull = (history: HistoryFacts): boolean =>
  history.historySizeBytes >= HISTORY_GUARD_BYTES || history.historyLength >= HISTORY_LENGTH_HIGH_WATER;

/**
 * Continue-as-new is due (the workflow continues as new as soon as nothing is under way): Temporal
 * suggests it, or the history has no room left for one more exec or file operation, or its events
 * are past HISTORY_LENGTH_HIGH_WATER. Without the last two, a server that never suggests left a quiet
 * sandbox refusing every exec for good (no room for one, and nothing to make room).
 */
export function continueAsNewDue(history: HistoryFacts): boolean {
  return (
    history.continueAsNewSuggested ||
    history.historySizeBytes + CALL_HISTORY_MAX_BYTES > HISTORY_GUARD_BYTES ||
    history.historyLength >= HISTORY_LENGTH_HIGH_WATER
  );
}

/**
 * Whether the sandbox, in `state`, takes `call` with the history it has. An exec or file operation
 * is taken only while the history keeps room for the most it and every one under way may still add
 * (CALL_HISTORY_MAX_BYTES each) under HISTORY_GUARD_BYTES; any other call only while the history is
 * not full. Otherwise calls arriving beside a long command, or all at once, grew the history until
 * Temporal terminated the workflow, leaving its sandbox behind. Temporal's suggestion alone refuses
 * nothing: a long command (a dev server) would lock every call out at 4 MiB. The refusal is
 * UNAVAILABLE, to retry: once calls end, or the workflow has continued as new, the call is taken.
 */
export function decideHistoryRoom(
  history: HistoryFacts,
  call: SandboxCall,
  state: SandboxState,
): Rejection | undefined {
  if (takenWhateverTheHistory(call, state)) return undefined;
  if (historyFull(history)) {
    return {
      code: 'UNAVAILABLE',
      message: `sandbox: ${call} not taken now: its history is full (${HISTORY_GUARD_BYTES / (1024 * 1024)} MiB or ${HISTORY_LENGTH_HIGH_WATER} events); it continues as new once its running commands, file operations and state changes end; retry`,
    };
  }
  const reserved = (history.callsUnderWay + 1) * CALL_HISTORY_MAX_BYTES;
  if (LARGE_CALLS.includes(call) && history.historySizeBytes + reserved > HISTORY_GUARD_BYTES) {
    return {
      code: 'UNAVAILABLE',
      message: `sandbox: ${call} not taken now: its history keeps room for the ${history.callsUnderWay} commands and file operations under way, and none for more; it continues as new once they end; retry`,
    };
  }
  return undefined;
}

// ---------------------------------------------------------------- pause modes

export interface PauseModeFacts {
  reason: SuspensionReason;
  workspace: Workspace['kind'];
  policyPauseMode?: 'auto' | PauseMode;
  advertised: PauseMode[];
}

/** `retained` means no advertised mode is safe: keep the sandbox rather than fake one. */
export type PauseDecision = { kind: 'release'; mode: PauseMode } | { kind: 'retain'; wanted: PauseMode; why: string };

export function choosePauseMode(facts: PauseModeFacts): PauseDecision {
  let wanted: PauseMode;
  if (facts.policyPauseMode && facts.policyPauseMode !== 'auto') wanted = facts.policyPauseMode;
  else if (facts.reason === 'POLICY_HOLD') wanted = 'DETACH';
  else wanted = facts.workspace === 'active' ? 'TERMINATE' : 'SNAPSHOT_AND_TERMINATE';
  // Terminating an isolated workspace without a snapshot would lose it.
  if (wanted === 'TERMINATE' && facts.workspace === 'isolated') wanted = 'SNAPSHOT_AND_TERMINATE';
  if (facts.advertised.includes(wanted)) return { kind: 'release', mode: wanted };
  return { kind: 'retain', wanted, why: `provider does not advertise ${wanted}` };
}

// ---------------------------------------------------------------- release blocking

export interface JobState extends Job {
  status: 'running' | 'succeeded' | 'failed' | 'cancelled';
}

/** Jobs that keep compute busy across a suspension: CONTINUE/DETACH with SANDBOX affinity. */
export function blockingJobs(jobs: JobState[]): JobState[] {
  return jobs.filter(
    (j) =>
      j.status === 'running' &&
      j.executionAffinity === 'SANDBOX' &&
      (j.pauseBehavior === 'CONTINUE' || j.pauseBehavior === 'DETACH'),
  );
}

/** Background CANCEL jobs are cancelled when the Run suspends. */
export function jobsToCancel(jobs: JobState[]): JobState[] {
  return jobs.filter(
    (j) => j.status === 'running' && j.pauseBehavior === 'CANCEL' && j.executionAffinity === 'SANDBOX',
  );
}

const SETTLED: ResourceState[] = ['RELEASED', 'DESTROYED'];

/** A child Run as its parent knows it: its record's last reported state, and why it closed unreported, if it did. */
export interface ChildState {
  runId: string;
  state: ResourceState;
  /** The child closed without its final report (terminated, timed out): it holds nothing its parent can wait for. */
  closed?: string;
}

/**
 * A parent's release (and its completion) waits until every child's record is released (or gone, or
 * the child closed unreported). With `statuses`, the children's reported Run statuses, a child whose
 * Run has ended blocks nothing either: its compute no longer changes (a cancelled child that cannot
 * snapshot keeps its sandbox ACTIVE or RETAINED for good), so waiting for it would never end.
 */
export function blockingChildren(children: ChildState[], statuses?: Record<string, RunStatus>): string[] {
  const ended = (c: ChildState) => statuses?.[c.runId] !== undefined && isTerminalRunStatus(statuses[c.runId]);
  return children.filter((c) => !c.closed && !SETTLED.includes(c.state) && !ended(c)).map((c) => c.runId);
}

/**
 * How long a finishing parent waits before it pings its unwatched children again (whether they still
 * take signals), after `pings` pings: 30 s doubling to 1 h, so a long child costs its parent a few
 * history events an hour, not five every 30 s (Temporal ended the parent at its history limit).
 */
export function childPingDelayMs(pings: number): number {
  return Math.min(30_000 * 2 ** pings, 3_600_000);
}

export function isReleaseBlocked(
  jobs: JobState[],
  children: ChildState[],
  statuses?: Record<string, RunStatus>,
): boolean {
  return blockingJobs(jobs).length > 0 || blockingChildren(children, statuses).length > 0;
}

// ---------------------------------------------------------------- receipts and retries

/**
 * Temporal retry for release: 1 s doubling to 5 min; no maximumAttempts means no attempt
 * limit. What no retry can fix (the one non-retryable set) fails at once.
 */
export const RELEASE_RETRY = {
  initialInterval: '1s',
  backoffCoefficient: 2,
  maximumInterval: '5m',
  nonRetryableErrorTypes: nonRetryableErrorTypes(),
} as const;

/** The backoff Temporal applies before attempt `attempt` (1-based), in ms. */
export function releaseBackoffMs(attempt: number): number {
  if (attempt <= 1) return 0;
  return Math.min(1_000 * 2 ** (attempt - 2), 300_000);
}

/** What a receipt must match: the request it answers. */
export interface ReleaseRequestFacts {
  sandboxId: string;
  idempotencyKey: string;
  mode: PauseMode;
  fence: number;
}

export interface ReleaseReceiptFacts extends ReleaseRequestFacts {
  computeReleased: boolean;
  checkpoint?: { uri: string; sha256: string; bytes: number };
}

/**
 * Why a receipt does not confirm the release it answers, or undefined when it does.
 * It must answer this very request (sandbox, key, fence, mode); TERMINATE and
 * SNAPSHOT_AND_TERMINATE must have released compute, and a snapshot needs its
 * checkpoint. DETACH never frees compute, so it needs no confirmation.
 */
export function receiptProblem(request: ReleaseRequestFacts, receipt: ReleaseReceiptFacts): string | undefined {
  for (const field of ['sandboxId', 'idempotencyKey', 'fence', 'mode'] as const) {
    if (receipt[field] !== request[field]) {
      return `receipt ${field} ${JSON.stringify(receipt[field])} does not match the request's ${JSON.stringify(request[field])}`;
    }
  }
  if (request.mode === 'DETACH') return undefined;
  if (!receipt.computeReleased) return `receipt for ${request.mode} says computeReleased=false`;
  if (request.mode === 'SNAPSHOT_AND_TERMINATE' && !receipt.checkpoint)
    return 'receipt for SNAPSHOT_AND_TERMINATE has no checkpoint';
  return undefined;
}

export const releaseIdempotencyKey = (ownerId: string, sandboxId: string, fence: number): string =>
  `${ownerId}/${sandboxId}/${fence}/release`;

// ---------------------------------------------------------------- resume

export type ResumePlan =
  | { kind: 'attach' }
  | { kind: 'reprovision' }
  | { kind: 'restore'; preferHost?: string }
  | { kind: 'none'; why: string };

/** How a suspended sandbox comes back, from the state its record reached. */
export function planResume(record: ExecutionResourceRecord): ResumePlan {
  switch (record.state) {
    case 'RETAINED':
    case 'ACTIVE':
    case 'RELEASING':
    case 'RELEASE_BLOCKED':
      // Nothing was released (or the release was cancelled before its receipt): the sandbox lives.
      return { kind: 'attach' };
    case 'RELEASED':
      if (record.pauseMode === 'DETACH') return { kind: 'attach' };
      if (record.pauseMode === 'TERMINATE') return { kind: 'reprovision' };
      return { kind: 'restore', preferHost: record.hostId };
    default:
      return { kind: 'none', why: `record is ${record.state}` };
  }
}

/**
 * Whether an answered Run's deferred resume can travel with its next action (one activity on the
 * host instead of a resume, a workflow task and the action): only a sandbox job the Run waits for.
 * A background job would leave the Run RESUMING while later actions need the sandbox; every other
 * action resumes first.
 */
export function fusesWithResume(action: { type: string; executionAffinity?: string; background?: boolean }): boolean {
  return action.type === 'job' && action.executionAffinity === 'SANDBOX' && action.background !== true;
}

/**
 * Whether a Run whose resume was deferred may go into its next suspension (an ask or a hold) with the
 * sandbox left where it is: only when the sandbox was fully released (`before`, the record's state
 * when the resume began) in the very mode the new suspension would release it in. Otherwise it comes
 * back and goes again (a new checkpoint, or the mode the new reason wants).
 */
export function staysReleased(
  before: ResourceState,
  releasedIn: PauseMode | undefined,
  decision: PauseDecision,
): boolean {
  return before === 'RELEASED' && decision.kind === 'release' && decision.mode === releasedIn;
}

/**
 * The run/spec/policy hashes a restored workspace was checkpointed under, from the
 * checkpoint's labels. A workspace that came back from a checkpoint (or its local
 * copy) must say; a host-persistent workspace re-provisioned in place records none.
 */
export function recordedHashes(
  restored: { source: string; labels?: Record<string, string> } | undefined,
): Partial<Hashes> | undefined {
  if (!restored || restored.source === 'workspace') return undefined;
  const labels = restored.labels ?? {};
  return { run: labels.runhash ?? '', spec: labels.spechash ?? '', policy: labels.policyhash ?? '' };
}

/** Names which of run/spec/policy differ between what is computed now and what was stored. */
export function hashMismatches(now: Hashes, ...stored: (Partial<Hashes> | undefined)[]): string[] {
  const bad = new Set<string>();
  for (const s of stored) {
    if (!s) continue;
    for (const k of ['run', 'spec', 'policy'] as const) {
      if (s[k] !== undefined && s[k] !== now[k]) bad.add(k);
    }
  }
  return [...bad];
}

// ---------------------------------------------------------------- a Run's end

/**
 * What the end of a Run that keeps its workspace (cancelled, failed) does first with a sandbox it finds
 * mid-change, by its record's state; undefined when the sandbox is settled enough to be released as it is.
 * - PROVISIONING (a provision cut short or failed): `destroy`. The agent has done nothing in it yet, so
 *   there is no workspace to keep, while what the provision made may already run; the capabilities a
 *   release needs were never learnt. Destroyed, the record says DESTROYED, so the host that made it
 *   (unknown to the record) removes whatever a destroy that reached another host could not.
 * - RESTORING (a resume the end cut short): `finishResume`. The restore may have brought compute back, in
 *   part or whole, which no released record would name, so it is finished and then released: the record ends
 *   RELEASED with a checkpoint of the whole workspace, and no process stays.
 */
export function settleAtEnd(state: ResourceState): 'destroy' | 'finishResume' | undefined {
  if (state === 'PROVISIONING') return 'destroy';
  return state === 'RESTORING' ? 'finishResume' : undefined;
}

// ---------------------------------------------------------------- destroy

/** Record states a destroy announces itself from: all but the ones a destroy has already reached. */
export const DESTROYABLE: readonly ResourceState[] = RESOURCE_STATES.filter(
  (s) => s !== 'DESTROYING' && s !== 'DESTROYED',
);

/**
 * The record's state while a destroy cancels a release, waits for the host (one that is gone
 * takes a while to count as gone) and deletes the checkpoints: DESTROYING, then DESTROYED.
 * Undefined when `state` already says so.
 */
export function destroyingState(state: ResourceState): ResourceState | undefined {
  return DESTROYABLE.includes(state) ? 'DESTROYING' : undefined;
}

// ---------------------------------------------------------------- runs

/** Where a Run is: its user-visible status and the phase of its sandbox's suspension. */
export interface RunState {
  status: RunStatus;
  phase: RunPhase;
}

export const TERMINAL_RUN_STATUSES: readonly RunStatus[] = ['COMPLETED', 'FAILED', 'CANCELLED', 'EXPIRED'];
export const isTerminalRunStatus = (status: RunStatus): boolean => TERMINAL_RUN_STATUSES.includes(status);

/**
 * The status × phase table: which phases each status may be in. A Run suspended by
 * hand or by a hold stays RUNNING; one waiting on an answer is WAITING; an answered
 * Run is RUNNING again while its sandbox comes back. An ended Run has no suspension.
 */
export const RUN_STATES: Record<RunStatus, readonly RunPhase[]> = {
  RUNNING: ['ACTIVE', 'SUSPENDING', 'SUSPENDED', 'RESUMING'],
  WAITING: ['ACTIVE', 'SUSPENDING', 'SUSPENDED', 'RESUMING'],
  COMPLETED: ['ACTIVE'],
  FAILED: ['ACTIVE'],
  CANCELLED: ['ACTIVE'],
  EXPIRED: ['ACTIVE'],
};

export type RunEvent =
  | 'ask'
  | 'answered'
  | 'suspend'
  | 'suspended'
  | 'resume'
  | 'resumed'
  | 'resumeSkipped'
  | 'complete'
  | 'fail'
  | 'cancel'
  | 'expire';

const LIVE: RunStatus[] = ['RUNNING', 'WAITING'];
const ALL_PHASES: RunPhase[] = ['ACTIVE', 'SUSPENDING', 'SUSPENDED', 'RESUMING'];

/**
 * Every legal Run transition: from which statuses and phases, to what (an unset
 * side stays). Ending a Run (fail, cancel, expire) clears its suspension. An agent
 * whose resume is deferred (RESUMING) may ask; if its sandbox stays released for the
 * next suspension (staysReleased), the resume is skipped: RESUMING → SUSPENDING.
 */
export const RUN_TRANSITIONS: Record<RunEvent, { status: RunStatus[]; phase: RunPhase[]; to: Partial<RunState> }> = {
  ask: { status: ['RUNNING'], phase: ['ACTIVE', 'RESUMING'], to: { status: 'WAITING' } },
  answered: { status: ['WAITING'], phase: ALL_PHASES, to: { status: 'RUNNING' } },
  suspend: { status: LIVE, phase: ['ACTIVE'], to: { phase: 'SUSPENDING' } },
  suspended: { status: LIVE, phase: ['SUSPENDING'], to: { phase: 'SUSPENDED' } },
  resume: { status: LIVE, phase: ['SUSPENDED'], to: { phase: 'RESUMING' } },
  resumed: { status: LIVE, phase: ['RESUMING'], to: { phase: 'ACTIVE' } },
  resumeSkipped: { status: LIVE, phase: ['RESUMING'], to: { phase: 'SUSPENDING' } },
  complete: { status: ['RUNNING'], phase: ['ACTIVE'], to: { status: 'COMPLETED' } },
  fail: { status: LIVE, phase: ALL_PHASES, to: { status: 'FAILED', phase: 'ACTIVE' } },
  cancel: { status: LIVE, phase: ALL_PHASES, to: { status: 'CANCELLED', phase: 'ACTIVE' } },
  expire: { status: LIVE, phase: ALL_PHASES, to: { status: 'EXPIRED', phase: 'ACTIVE' } },
};

/** The state after `event`, or a rejection naming the illegal transition. */
export function nextRunState(state: RunState, event: RunEvent): RunState | Rejection {
  const rule = RUN_TRANSITIONS[event];
  if (!rule.status.includes(state.status) || !rule.phase.includes(state.phase)) {
    return { code: 'INVALID_STATE_TRANSITION', message: `run: cannot ${event} while ${state.status}/${state.phase}` };
  }
  return { status: rule.to.status ?? state.status, phase: rule.to.phase ?? state.phase };
}

export const isRejection = (value: object): value is Rejection => 'code' in value;

/** What the admission rules of a Run's operations look at, besides its state. */
export interface RunFacts extends RunState {
  /** A suspend was asked for and the agent loop has not taken it up yet. */
  suspendRequested: boolean;
  suspensionReason?: SuspensionReason;
  /** Retention ran out: the Run is being (or has been) expired. */
  expiring: boolean;
  runningJobs: number;
}

export type RunOp = 'suspend' | 'resume' | 'cancel' | 'continueAsNew';

const STALE_RUN: Rejection = {
  code: 'STALE_SANDBOX_ROUTE',
  message: 'run: suspended past retention; its route is stale',
};

/**
 * Admission of the Run's operations (answers have checkRespond): a suspend of a RUNNING Run
 * that is ACTIVE or RESUMING (taken by the agent loop once the resume and the action under way
 * are done: a resume may wait for the agent's next step or ride with its job), a resume only of
 * a manual or held suspension (an interaction is resumed by its answer), a cancel of any live
 * Run, continue-as-new only between steps.
 */
export function admitRunOp(facts: RunFacts, op: RunOp): Rejection | undefined {
  if (facts.expiring || facts.status === 'EXPIRED') return STALE_RUN;
  if (isTerminalRunStatus(facts.status)) return { code: 'INVALID_STATE_TRANSITION', message: `run is ${facts.status}` };
  switch (op) {
    case 'suspend': {
      const live = facts.phase === 'ACTIVE' || facts.phase === 'RESUMING';
      if (facts.status !== 'RUNNING' || !live || facts.suspendRequested) {
        return {
          code: 'INVALID_STATE_TRANSITION',
          message: `run: cannot suspend while ${facts.status}/${facts.phase}`,
        };
      }
      return undefined;
    }
    case 'resume': {
      const reason = facts.suspensionReason;
      if (facts.phase !== 'SUSPENDED' || (reason !== 'MANUAL' && reason !== 'POLICY_HOLD')) {
        return {
          code: 'INVALID_STATE_TRANSITION',
          message: `run: nothing to resume (${facts.phase}${reason ? `, ${reason}` : ''}); answer its interaction instead`,
        };
      }
      return undefined;
    }
    case 'cancel':
      return undefined;
    case 'continueAsNew':
      if (facts.phase !== 'ACTIVE' || facts.runningJobs > 0) {
        return {
          code: 'INVALID_STATE_TRANSITION',
          message: 'run: continue-as-new waits for an active Run with no running job',
        };
      }
      return undefined;
  }
}

// ---------------------------------------------------------------- history high-water mark

/**
 * The history size (bytes, as Temporal counts it) that a Run's history, with the room kept for what its
 * running jobs and children may still add, does not pass by more than one step (waitsForJobs). Temporal
 * terminates a workflow at 50 MiB (and the Run leaves its sandbox behind); it suggests continue-as-new
 * from 4 MiB, which a Run with a job running must refuse. The 18 MiB left take what still comes once the
 * mark is reached: the step under way (an exec result is up to two 128 KiB streams at six bytes of JSON a
 * control character, 1.5 MiB, once more in the next step's input for a driver whose steps are
 * activities) and the room of the job or child it started, the handlers' events and the Run's ending.
 */
export const HISTORY_SIZE_HIGH_WATER_BYTES = 32 * 1024 * 1024;
/**
 * The same in events: Temporal terminates a workflow at 51,200; a step takes about ten (its workflow
 * tasks, activities, an upsert), so 11,200 leave room for a thousand and more after the mark.
 */
export const HISTORY_LENGTH_HIGH_WATER = 40_000;

/**
 * The most one running job or child Run may still add to the Run's history when it ends: a child's
 * result is one payload in its ChildWorkflowExecutionCompleted event, at most Temporal's 2 MiB (a larger
 * one fails the child), and 16 KiB more for the event's own fields. A foreground job's result is less
 * (two streams of 128 KiB at six bytes of JSON a control character, 1.5 MiB); a background job's is a
 * few hundred bytes (its activity returns no output, keepOutput false), but one started by a worker
 * before that returns its output, and the same bound covers both.
 */
export const RUN_ITEM_HISTORY_MAX_BYTES = 2 * 1024 * 1024 + 16 * 1024;

/** What waitsForJobs looks at: the Run's history so far, its running jobs and children. */
export interface RunHistoryFacts {
  /** workflowInfo().historySize: bytes. */
  historySize: number;
  /** workflowInfo().historyLength: events. */
  historyLength: number;
  runningJobs: number;
  /** Children this workflow run started whose result has not reached its history yet. */
  runningChildren: number;
}

/**
 * Whether the Run takes no further agent step until a running job or child ends (backpressure): each
 * may still add up to RUN_ITEM_HISTORY_MAX_BYTES when it ends, and a Run with a job running cannot
 * continue as new (admitRunOp), so room is kept for all of them, as the sandbox keeps it for its calls
 * (decideHistoryRoom): the Run waits once its history and that room reach HISTORY_SIZE_HIGH_WATER_BYTES,
 * or its history passes HISTORY_LENGTH_HIGH_WATER events with one running. Whatever the order in which
 * they start and end, the history then never passes the mark by more than the step that started the
 * last of them and its room. Once nothing runs the Run takes its next step, or continues as new.
 */
export function waitsForJobs(facts: RunHistoryFacts): boolean {
  const running = facts.runningJobs + facts.runningChildren;
  if (running === 0) return false;
  return (
    facts.historySize + running * RUN_ITEM_HISTORY_MAX_BYTES >= HISTORY_SIZE_HIGH_WATER_BYTES ||
    facts.historyLength >= HISTORY_LENGTH_HIGH_WATER
  );
}

// ---------------------------------------------------------------- external actions

/** What admitting an external agent's action looks at. */
export interface ActionFacts extends RunState {
  /** The Run's agent is the external driver. */
  external: boolean;
  expiring: boolean;
  /** The Run completes (a `complete` action is settling it): it takes nothing more. */
  ending: boolean;
  /** A suspend was asked for and the agent loop has not taken it up yet. */
  suspendRequested: boolean;
  /** An action accepted and not yet finished. */
  inProgress?: string;
  /** The action already sent under this actionId. */
  known?: { actionId: string; bodyHash: string };
}

/**
 * Admission of an external agent's action. A known actionId is answered first: the
 * same body is a duplicate (its outcome, never a second run), another body a conflict.
 * Otherwise one action at a time, only while the Run is live, active and waiting for one.
 */
export function admitAction(facts: ActionFacts, bodyHash: string): Rejection | 'duplicate' | undefined {
  if (facts.known) {
    if (facts.known.bodyHash === bodyHash) return 'duplicate';
    return {
      code: 'IDEMPOTENCY_CONFLICT',
      message: `action ${facts.known.actionId}: this actionId was already used with another body`,
    };
  }
  if (!facts.external) {
    return {
      code: 'INVALID_STATE_TRANSITION',
      message: 'run: its agent is not the external driver; it takes no actions',
    };
  }
  if (facts.expiring || facts.status === 'EXPIRED') return STALE_RUN;
  if (isTerminalRunStatus(facts.status) || facts.ending) {
    return {
      code: 'INVALID_STATE_TRANSITION',
      message: `run is ${facts.ending ? 'completing' : facts.status}: it takes no more actions`,
    };
  }
  if (facts.inProgress !== undefined) {
    return {
      code: 'INVALID_STATE_TRANSITION',
      message: `run: action ${facts.inProgress} is still under way (one action at a time)`,
    };
  }
  if (facts.status !== 'RUNNING' || facts.phase !== 'ACTIVE' || facts.suspendRequested) {
    return {
      code: 'INVALID_STATE_TRANSITION',
      message: `run: not waiting for an action while ${facts.status}/${facts.suspendRequested ? 'SUSPENDING' : facts.phase}`,
    };
  }
  return undefined;
}

// ---------------------------------------------------------------- update arguments

/**
 * An Update takes exactly its arguments: a missing or extra one is a malformed
 * call, refused by the validator like a bad field (never silently ignored: a
 * no-argument state change called with junk would otherwise go ahead).
 */
export function checkArity(update: string, args: readonly unknown[], expected: number): Rejection | undefined {
  if (args.length === expected) return undefined;
  const takes = expected === 0 ? 'no arguments' : expected === 1 ? 'one argument' : `${expected} arguments`;
  return { code: 'INVALID_ARGUMENT', message: `${update}: takes ${takes}, got ${args.length}` };
}

// ---------------------------------------------------------------- interactions

export interface AnsweredBy {
  updateId?: string;
}

/**
 * The respond validator: unknown interaction, already answered (unless the identical
 * answer under the same update id), wrong payload kind, or an expired Run.
 */
export function checkRespond(
  run: {
    status: RunStatus;
    interactions: InteractionRequest[];
    answeredBy: Record<string, AnsweredBy>;
    expiring?: boolean;
  },
  input: { interactionId: string; response: unknown },
  updateId: string | undefined,
): Rejection | 'duplicate' | undefined {
  if (run.status === 'EXPIRED' || run.expiring)
    return { code: 'STALE_SANDBOX_ROUTE', message: 'run: suspended past retention; answers are no longer accepted' };
  const interaction = run.interactions.find((i) => i.id === input.interactionId);
  if (!interaction) return { code: 'NOT_FOUND', message: `interaction ${input.interactionId} not found` };
  if (interaction.status === 'answered') {
    const sameUpdate = updateId !== undefined && run.answeredBy[interaction.id]?.updateId === updateId;
    if (sameUpdate && sameJson(interaction.response, input.response)) return 'duplicate';
    return { code: 'ALREADY_ANSWERED', message: `interaction ${interaction.id} was already answered` };
  }
  if (interaction.status !== 'pending')
    return { code: 'ALREADY_ANSWERED', message: `interaction ${interaction.id} is ${interaction.status}` };
  // An answer the interaction does not accept (or an option it does not offer) changes nothing.
  const problem = answerProblem(interaction, input.response);
  if (problem) return { code: 'INVALID_ARGUMENT', message: problem };
  if (['COMPLETED', 'FAILED', 'CANCELLED'].includes(run.status)) {
    return { code: 'INVALID_STATE_TRANSITION', message: `run is ${run.status}` };
  }
  return undefined;
}

function sameJson(a: unknown, b: unknown): boolean {
  return canonicalJson(a) === canonicalJson(b);
}

function reject(code: ErrorCode, message: string): SandboxDecision {
  return { kind: 'reject', rejection: { code, message } };
}
