import { ApplicationFailure, condition, sleep } from '@temporalio/workflow';
import { DEFAULT_SUSPENDED_RETENTION_SECONDS } from '../common/defaults';
import { END_REASON } from '../common/errors';
import { computeRunHashes } from '../common/hashes';
import type { Hashes, SuspensionReason } from '../common/schemas';
import type { ExecOutcome, RestoreResult } from '../providers/api';
import { nowIso, nowMs } from './clock';
import {
  choosePauseMode,
  hashMismatches,
  isReleaseBlocked,
  jobsToCancel,
  recordedHashes,
  staysReleased,
  type PauseDecision,
} from './lifecycle';
import {
  PATCH_ENDED_CHILDREN,
  PATCH_EXPIRY_DESTROYS,
  PATCH_EXPIRY_FIRST,
  PATCH_IDLE_ATTACH,
  PATCH_LEAN_CYCLE,
  PATCH_RECORDED_HASHES,
  PATCH_STAY_RELEASED,
  shared,
  type RunController,
} from './run-controller';

// Suspension: SUSPENDING → SUSPENDED → (answer, resume or retention expiry) → RESUMING → ACTIVE.
// A resume deferred to the next action may instead go RESUMING → SUSPENDING when that action is an
// ask or a hold that keeps the sandbox released as it is (PATCH_STAY_RELEASED).

/**
 * SUSPENDING → SUSPENDED: choose the pause mode, cancel CANCEL jobs, release
 * compute (blocked while CONTINUE/DETACH jobs or children hold it), then wait for
 * the answer, a resume, or retention expiry; RESUMING brings the sandbox back.
 */
export async function suspendAndWait(
  c: RunController,
  reason: SuspensionReason,
  interactionIds: string[],
  /**
   * The caller's next action goes through the agent loop's perform(), which brings the sandbox back
   * first (completeResume) or with a sandbox job (resumeWithJob): the resume may wait for it.
   */
  deferResume = false,
): Promise<void> {
  const run = c.run;
  c.manualSuspendRequested = false;
  c.resumeRequested = false;
  const decision = pauseDecision(c, reason);
  // A deferred resume not taken by the caller's action: the sandbox stays released (no restore, no release).
  const stay = keepsReleased(c, reason);
  if (stay) {
    undoPendingResume(c);
    c.transition('resumeSkipped');
  } else {
    // perform() brought the sandbox back already (awaited only then: an await reorders the commands replay expects).
    if (c.pendingResume) await completeResume(c);
    c.transition('suspend');
  }
  const retentionSeconds = run.spec.policy?.suspendedRetentionSeconds ?? DEFAULT_SUSPENDED_RETENTION_SECONDS;
  run.suspension = {
    reason,
    pauseMode: decision.kind === 'release' ? decision.mode : decision.wanted,
    since: nowIso(),
    hashes: run.hashes,
    interactionIds,
    ...(retentionSeconds > 0 ? { expiresAt: new Date(nowMs() + retentionSeconds * 1000).toISOString() } : {}),
  };
  for (const job of jobsToCancel(run.jobs)) c.jobScopes.get(job.id)?.cancel();
  // A sandbox that stays released is so in this mode already, with the checkpoint the next resume restores.
  if (!stay) {
    if (decision.kind === 'retain') c.sandbox.retain(decision.why);
    else {
      const statuses = run.children.length > 0 && c.patched(PATCH_ENDED_CHILDREN) ? run.childStatus : undefined;
      c.sandbox.startRelease(decision.mode, reason, c.labels(), () =>
        isReleaseBlocked(run.jobs, run.children, statuses),
      );
    }
  }
  c.transition('suspended');

  const resumed = () =>
    reason === 'INTERACTION'
      ? interactionIds.every((id) => run.interactions.find((i) => i.id === id)?.status !== 'pending')
      : c.resumeRequested;
  const answered =
    retentionSeconds === 0
      ? (await condition(resumed), true)
      : c.patched(PATCH_LEAN_CYCLE)
        ? await untilAnsweredOrExpired(c, resumed, nowMs() + retentionSeconds * 1000)
        : await condition(resumed, retentionSeconds * 1000);
  if (!answered) {
    await expire(c);
    return;
  }
  c.transition('resume');
  const checkpointHashes = run.checkpoint.hashes;
  const fusable = deferResume && c.patched(PATCH_LEAN_CYCLE);
  if (fusable && canDeferResume(c, checkpointHashes)) {
    // Begun now (fence raised, RESTORING: published with the answer); the sandbox comes back with the next action.
    c.pendingResume = { checkpointHashes, start: await c.sandbox.beginResume() };
    c.resumesTaken += 1;
    return;
  }
  settleResume(c, await c.sandbox.resume(), checkpointHashes);
}

function pauseDecision(c: RunController, reason: SuspensionReason): PauseDecision {
  const run = c.run;
  return choosePauseMode({
    reason,
    workspace: run.spec.sandbox.workspace?.kind ?? 'isolated',
    ...(run.spec.policy?.pauseMode ? { policyPauseMode: run.spec.policy.pauseMode } : {}),
    advertised: c.sandbox.capabilities?.pauseModes ?? [],
  });
}

/**
 * Whether a Run whose resume is deferred goes into a suspension for `reason` with its sandbox left
 * released (staysReleased): a restore and a release of the same thing would be paid for nothing.
 */
export function keepsReleased(c: RunController, reason: SuspensionReason | undefined): boolean {
  const pending = c.pendingResume;
  if (!pending || !reason || !c.patched(PATCH_STAY_RELEASED)) return false;
  return staysReleased(pending.start.before, c.sandbox.record.pauseMode, pauseDecision(c, reason));
}

/**
 * Waits for `resumed` until `deadlineMs`; false once the deadline has passed. The timer is the Run's
 * one retention timer: a suspension answered before it fires leaves it running for the next one
 * (no timer started and cancelled per cycle); one that fires before this suspension's deadline (it
 * was started for an earlier one) is followed by a timer for the time left.
 */
async function untilAnsweredOrExpired(c: RunController, resumed: () => boolean, deadlineMs: number): Promise<boolean> {
  for (;;) {
    const pending = c.expiryTimer;
    const timer = pending && !pending.fired && pending.atMs <= deadlineMs ? pending : startExpiryTimer(c, deadlineMs);
    await condition(() => resumed() || timer.fired);
    if (resumed()) return true;
    if (timer.atMs >= deadlineMs) return false;
  }
}

function startExpiryTimer(c: RunController, atMs: number): { atMs: number; fired: boolean } {
  const timer = { atMs, fired: false };
  c.expiryTimer = timer;
  // Not awaited: a cancelled Run cancels it with its scope, and the Run's end drops it.
  void sleep(Math.max(1, atMs - nowMs())).then(
    () => (timer.fired = true),
    () => undefined,
  );
  return timer;
}

/**
 * Whether the answered Run's sandbox may come back with its next action: not when idleTimeout froze
 * it (the job would find it frozen), nor when its hashes already differ (the resume refuses at once).
 */
function canDeferResume(c: RunController, checkpointHashes: Hashes): boolean {
  const run = c.run;
  if (run.idlePaused) return false;
  const now = computeRunHashes(run.runId, run.spec, run.parentRunId);
  return hashMismatches(now, run.suspension?.hashes, checkpointHashes).length === 0;
}

/** Brings back a sandbox whose resume was deferred, before an action that does not take it along. */
export async function completeResume(c: RunController): Promise<void> {
  const pending = c.pendingResume;
  if (!pending) return;
  c.pendingResume = undefined;
  settleResume(c, await c.sandbox.resume(pending.start), pending.checkpointHashes);
}

/** The Run ends with its resume begun and not done: the record says the sandbox is still where it was. */
export function undoPendingResume(c: RunController): void {
  const pending = c.pendingResume;
  if (!pending) return;
  c.pendingResume = undefined;
  c.sandbox.undoResume(pending.start);
}

/**
 * Brings back a sandbox whose resume was deferred together with the job `jobId` (one activity).
 * The hashes the checkpoint recorded are checked on the host before the job runs, and here again.
 */
export async function resumeWithJob(
  c: RunController,
  jobId: string,
  command: string,
  options: { timeoutMs?: number },
): Promise<ExecOutcome> {
  const run = c.run;
  const pending = c.pendingResume!;
  c.pendingResume = undefined;
  const now = computeRunHashes(run.runId, run.spec, run.parentRunId);
  let result: { restored?: RestoreResult; outcome?: ExecOutcome };
  try {
    // A local agent step follows in this workflow task: what changes now is published with it.
    result = await c.sandbox.resumeAndExec(pending.start, jobId, command, now, options, () => {
      if (c.localSteps) c.holdPublishing();
    });
  } catch (err) {
    // The sandbox came back and only the job failed: the Run is active again, the job's failure stands.
    if (c.sandbox.record.state === 'ACTIVE') settleResume(c, undefined, pending.checkpointHashes);
    throw err;
  }
  settleResume(c, result.restored, pending.checkpointHashes);
  if (!result.outcome) throw new Error(`job ${jobId} did not run after the resume`);
  return result.outcome;
}

/** RESUMING → ACTIVE once the sandbox is back, unless its hashes changed while it was suspended. */
function settleResume(c: RunController, restored: RestoreResult | undefined, checkpointHashes: Hashes): void {
  const run = c.run;
  // Attached, the sandbox is as it was left: still frozen if idleTimeout froze it (the next job thaws it).
  if (restored || !run.idlePaused || !c.patched(PATCH_IDLE_ATTACH)) run.idlePaused = false;
  // Compared with what the checkpoint recorded, not with the workflow's own copies of the spec.
  const now = computeRunHashes(run.runId, run.spec, run.parentRunId);
  const stored = restored?.labels
    ? { run: restored.labels.runhash, spec: restored.labels.spechash, policy: restored.labels.policyhash }
    : undefined;
  const before = hashMismatches(now, run.suspension?.hashes, checkpointHashes, stored);
  const recorded = hashMismatches(now, recordedHashes(restored));
  const bad = before.join() === recorded.join() || !c.patched(PATCH_RECORDED_HASHES) ? before : recorded;
  if (bad.length > 0) {
    throw ApplicationFailure.create({
      type: 'RESUME_HASH_MISMATCH',
      message: `run: ${bad.join(', ')} hash changed while suspended; refusing to continue`,
      nonRetryable: true,
    });
  }
  c.transition('resumed');
  c.resumesTaken += 1;
}

/** Retention expiry: compute released if it was not, checkpoint deleted, interactions expired. */
async function expire(c: RunController): Promise<void> {
  // From here answers and resumes are a stale route (the validators see `expiring`).
  c.expiring = true;
  const settle = () => {
    for (const i of c.run.interactions) if (i.status === 'pending') i.status = 'expired';
    c.run.error = { code: END_REASON.SUSPEND_EXPIRED, message: 'suspended longer than the retention period' };
    c.transition('expire');
  };
  if (c.patched(PATCH_EXPIRY_FIRST)) {
    settle();
    await releaseKeepingNothing(c);
  } else {
    await releaseKeepingNothing(c);
    settle();
  }
}

/** Ends a Run's hold on its sandbox keeping nothing: compute destroyed, every checkpoint deleted. */
export async function releaseKeepingNothing(c: RunController): Promise<void> {
  const sandbox = c.sandbox;
  if (sandbox.record.state === 'RETAINED') {
    await sandbox.destroy();
  } else if (c.patched(PATCH_EXPIRY_DESTROYS)) {
    // Nothing is kept, so no release is waited for (blocked, or queued for a host that is gone): destroy
    // cancels it, gives the host a bounded try (then its maintenance), and deletes the checkpoints of
    // every fence, also one a cancelled release uploaded without telling anyone.
    await sandbox.destroy();
  } else {
    // A release still blocked (by jobs or children) would wait for them forever: nothing is kept, so stop it.
    if (sandbox.record.state === 'RELEASE_BLOCKED' && c.patched(PATCH_EXPIRY_FIRST)) await sandbox.cancelRelease();
    await sandbox.settleRelease();
    const checkpoint = sandbox.record.checkpoint;
    if (sandbox.record.state !== 'RELEASED' || sandbox.record.pauseMode === 'DETACH') await sandbox.destroy();
    if (checkpoint) await shared.deleteCheckpoint({ uri: checkpoint.uri });
  }
}
