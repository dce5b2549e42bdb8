import {
  ApplicationFailure,
  CancellationScope,
  condition,
  getExternalWorkflowHandle,
  isCancellation,
  log,
} from '@temporalio/workflow';
import { END_REASON } from '../common/errors';
import { failureMessage } from './failures';
import { blockingChildren, childPingDelayMs, choosePauseMode, settleAtEnd, type RunEvent } from './lifecycle';
import { childPingSignal } from './definitions';
import {
  PATCH_CHILD_CLOSED_UNREPORTED,
  PATCH_CHILDREN_SURVIVE_CAN,
  PATCH_END_DESTROYS_PROVISIONING,
  PATCH_END_FINISHES_RESUME,
  PATCH_ENDED_CHILDREN,
  PATCH_FAILED_CANCELS_CHILDREN,
  PATCH_FAILED_KEEPS,
  PATCH_KEEP_RETAINED,
  PATCH_QUIET_CHILD_WAIT,
  PATCH_RELEASE_DETACHED,
  PATCH_UNCANCELLED_DESTROY,
  type RunController,
} from './run-controller';
import { isTerminal, liveChildren } from './run-state';
import { releaseKeepingNothing } from './run-suspension';

// How a Run ends: completed, failed, cancelled or past its ttl. Each settles the
// sandbox its own way; none leaves a job running.

/**
 * A finished Run: a completed one waits for its children's compute, then destroys its own sandbox; one
 * its agent failed releases its compute and keeps its workspace.
 */
export async function finish(c: RunController): Promise<void> {
  const run = c.run;
  const destroy = () => c.sandbox.destroy();
  if (!c.completed) {
    // Failed by its agent: its workspace is kept, only its compute goes (as endFailed).
    if (c.patched(PATCH_FAILED_KEEPS)) {
      const reason = run.error?.code ?? END_REASON.AGENT_FAILED;
      await CancellationScope.nonCancellable(async () => {
        // A parent that ends other than by completing cancels its children (DESIGN, "Runs").
        if (liveChildren(run).length > 0 && c.patched(PATCH_FAILED_CANCELS_CHILDREN)) await cancelChildren(c);
        await endWith(c, undefined, () => releaseCompute(c, reason));
      });
    } else await endWith(c, undefined, destroy);
    return;
  }
  // Children first: their Runs end and their compute is released before the parent completes.
  const statuses = run.children.length > 0 && c.patched(PATCH_ENDED_CHILDREN) ? run.childStatus : undefined;
  const settled = () => blockingChildren(run.children, statuses).length === 0 && liveChildren(run).length === 0;
  if (run.children.length === 0 || !c.patched(PATCH_CHILD_CLOSED_UNREPORTED)) await condition(settled);
  else if (c.patched(PATCH_QUIET_CHILD_WAIT)) await waitForChildren(c, settled);
  else while (!(await condition(settled, CHILD_PING_INTERVAL))) await pingUnwatchedChildren(c);
  // The Run is done: a cancel or a ttl that comes now does not stop its destroy halfway (DESTROYING for good).
  if (c.patched(PATCH_UNCANCELLED_DESTROY))
    await CancellationScope.nonCancellable(() => endWith(c, undefined, destroy));
  else await endWith(c, undefined, destroy);
  run.output = c.completed.output;
  c.transition('complete');
}

export async function endTtl(c: RunController): Promise<void> {
  for (const i of c.run.interactions) if (i.status === 'pending') i.status = 'cancelled';
  c.run.error = { code: END_REASON.TTL_EXPIRED, message: `run exceeded its ttl of ${c.run.spec.policy?.ttl}` };
  await endWith(c, 'expire', () => releaseKeepingNothing(c));
}

export async function endCancelled(c: RunController): Promise<void> {
  for (const i of c.run.interactions) if (i.status === 'pending') i.status = 'cancelled';
  await endWith(c, 'cancel', () => releaseCompute(c, 'cancelled'));
}

export async function endFailed(c: RunController, code: string, message: string): Promise<void> {
  c.run.error = { code, message };
  // Keep the workspace (and any checkpoint) of a failed Run; only its compute goes.
  await endWith(c, 'fail', () => releaseCompute(c, code));
}

/** The Run's result: its output, or a failure carrying its error. */
export function finalResult(c: RunController): unknown {
  const run = c.run;
  if (run.status === 'COMPLETED') return run.output;
  throw ApplicationFailure.create({
    type: run.error?.code ?? run.status,
    message: run.error?.message ?? `run ${run.status}`,
    nonRetryable: true,
  });
}

/** Releases compute but keeps the workspace: a snapshot where files are not host-persistent. */
async function releaseCompute(c: RunController, reason: string): Promise<void> {
  const sandbox = c.sandbox;
  await sandbox.cancelRelease();
  let state = sandbox.record.state;
  // A DETACH release (a hold's) left the compute running: released again, it goes, the workspace kept.
  const detached = state === 'RELEASED' && sandbox.record.pauseMode === 'DETACH';
  if (state === 'RELEASED' && !(detached && c.patched(PATCH_RELEASE_DETACHED))) return;
  if (state === 'DESTROYED' || sandbox.record.fence === 0) return;
  const first = settleAtEnd(state);
  if (first === 'destroy' && c.patched(PATCH_END_DESTROYS_PROVISIONING)) {
    await sandbox.destroy();
    return;
  }
  if (first === 'finishResume' && c.patched(PATCH_END_FINISHES_RESUME)) {
    await sandbox.finishCutShortResume();
    state = sandbox.record.state;
  }
  const decision = choosePauseMode({
    reason: 'MANUAL',
    workspace: c.run.spec.sandbox.workspace?.kind ?? 'isolated',
    advertised: sandbox.capabilities?.pauseModes ?? [],
  });
  if (decision.kind === 'retain') {
    // No snapshot is possible: destroying would lose the workspace, so it is kept (RETAINED).
    if (c.patched(PATCH_KEEP_RETAINED)) sandbox.noteError(`kept after the Run ended (${reason}): ${decision.why}`);
    else await sandbox.destroy();
    return;
  }
  if (!detached && state !== 'ACTIVE' && state !== 'RETAINED' && state !== 'RELEASE_BLOCKED' && state !== 'RELEASING') {
    await sandbox.resume();
  }
  await sandbox.releaseUnderNewFence(decision.mode, reason, c.labels());
}

/** Cancels every job, moves the Run to its end (`event`; none when already there), then cleans up. */
async function endWith(c: RunController, event: RunEvent | undefined, cleanup: () => Promise<void>): Promise<void> {
  for (const scope of c.jobScopes.values()) scope.cancel();
  if (event && !isTerminal(c.run.status)) c.transition(event);
  else {
    c.run.phase = 'ACTIVE';
    c.run.suspension = undefined;
    c.changed();
  }
  if (event && liveChildren(c.run).length > 0 && c.patched(PATCH_CHILDREN_SURVIVE_CAN)) await cancelChildren(c);
  try {
    await cleanup();
  } catch (err) {
    // A cleanup that was cancelled is not done: the Run does not go on as if it were.
    if (isCancellation(err) && c.patched(PATCH_UNCANCELLED_DESTROY)) throw err;
    c.sandbox.noteError(failureMessage(err));
  }
  c.changed();
}

/** A Run that ends other than by completing cancels its children (they outlive only its continue-as-new). */
async function cancelChildren(c: RunController): Promise<void> {
  await Promise.all(
    liveChildren(c.run).map((ch) =>
      getExternalWorkflowHandle(ch.runId)
        .cancel()
        .catch((err: unknown) =>
          log.info('could not cancel child run', { childId: ch.runId, error: failureMessage(err) }),
        ),
    ),
  );
}

/** How often a parent checked that children it cannot watch were still open (before PATCH_QUIET_CHILD_WAIT). */
const CHILD_PING_INTERVAL = '30s';

/**
 * Waits until `settled`. A child this workflow run started tells of its close by its handle, so it needs
 * no timer; one it cannot watch (started before a continue-as-new) is pinged, ever less often.
 */
async function waitForChildren(c: RunController, settled: () => boolean): Promise<void> {
  const unwatched = () => liveChildren(c.run).some((ch) => !c.watchedChildren.has(ch.runId));
  for (let pings = 0; !settled(); pings++) {
    if (!unwatched()) await condition(settled);
    else if (!(await condition(() => settled() || !unwatched(), childPingDelayMs(pings)))) {
      await pingUnwatchedChildren(c);
    }
  }
}

/** A child started before this workflow run that no longer takes signals has closed without its final report. */
async function pingUnwatchedChildren(c: RunController): Promise<void> {
  for (const ch of liveChildren(c.run)) {
    if (c.watchedChildren.has(ch.runId)) continue;
    await getExternalWorkflowHandle(ch.runId)
      .signal(childPingSignal)
      .catch((err: unknown) => c.childClosedUnreported(ch.runId, `closed: ${failureMessage(err)}`));
  }
}
