import { ApplicationFailure, condition } from '@temporalio/workflow';
import { DEFAULT_SUSPENDED_RETENTION_SECONDS } from '../common/defaults';
import { END_REASON } from '../common/errors';
import { computeRunHashes } from '../common/hashes';
import type { SuspensionReason } from '../common/schemas';
import { nowIso, nowMs } from './clock';
import { choosePauseMode, hashMismatches, isReleaseBlocked, jobsToCancel, recordedHashes } from './lifecycle';
import {
  PATCH_EXPIRY_DESTROYS,
  PATCH_EXPIRY_FIRST,
  PATCH_IDLE_ATTACH,
  PATCH_RECORDED_HASHES,
  shared,
  type RunController,
} from './run-controller';

// Suspension: SUSPENDING → SUSPENDED → (answer, resume or retention expiry) → RESUMING → ACTIVE.

/**
 * SUSPENDING → SUSPENDED: choose the pause mode, cancel CANCEL jobs, release
 * compute (blocked while CONTINUE/DETACH jobs or children hold it), then wait for
 * the answer, a resume, or retention expiry; RESUMING brings the sandbox back.
 */
export async function suspendAndWait(
  c: RunController,
  reason: SuspensionReason,
  interactionIds: string[],
): Promise<void> {
  const run = c.run;
  c.manualSuspendRequested = false;
  c.resumeRequested = false;
  c.transition('suspend');
  const decision = choosePauseMode({
    reason,
    workspace: run.spec.sandbox.workspace?.kind ?? 'isolated',
    ...(run.spec.policy?.pauseMode ? { policyPauseMode: run.spec.policy.pauseMode } : {}),
    advertised: c.sandbox.capabilities?.pauseModes ?? [],
  });
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
  if (decision.kind === 'retain') {
    c.sandbox.retain(decision.why);
  } else {
    c.sandbox.startRelease(decision.mode, reason, c.labels(), () => isReleaseBlocked(run.jobs, run.children));
  }
  c.transition('suspended');

  const resumed = () =>
    reason === 'INTERACTION'
      ? interactionIds.every((id) => run.interactions.find((i) => i.id === id)?.status !== 'pending')
      : c.resumeRequested;
  const answered =
    retentionSeconds > 0 ? await condition(resumed, retentionSeconds * 1000) : (await condition(resumed), true);
  if (!answered) {
    await expire(c);
    return;
  }
  await resume(c);
}

async function resume(c: RunController): Promise<void> {
  const run = c.run;
  c.transition('resume');
  const restored = await c.sandbox.resume();
  // Attached, the sandbox is as it was left: still frozen if idleTimeout froze it (the next job thaws it).
  if (restored || !run.idlePaused || !c.patched(PATCH_IDLE_ATTACH)) run.idlePaused = false;
  // Compared with what the checkpoint recorded, not with the workflow's own copies of the spec.
  const now = computeRunHashes(run.runId, run.spec, run.parentRunId);
  const stored = restored?.labels
    ? { run: restored.labels.runhash, spec: restored.labels.spechash, policy: restored.labels.policyhash }
    : undefined;
  const before = hashMismatches(now, run.suspension?.hashes, run.checkpoint.hashes, stored);
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
