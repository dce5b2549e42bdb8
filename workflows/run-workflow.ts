import {
  ApplicationFailure,
  CancellationScope,
  ContinueAsNew,
  isCancellation,
  patched,
  sleep,
  workflowInfo,
} from '@temporalio/workflow';
import { durationMs } from '../common/duration';
import { END_REASON } from '../common/errors';
import { runSpecIssues } from '../common/run-spec-checks';
import { failureCode, failureMessage } from './failures';
import type { RunWorkflowInput } from './definitions';
import { nowMs } from './clock';
import { agentLoop } from './run-agent';
import { RunController } from './run-controller';
import { endCancelled, endFailed, endTtl, finalResult } from './run-ending';
import { setRunHandlers } from './run-handlers';
import { isTerminal } from './run-state';
import { undoPendingResume } from './run-suspension';
import { drainWebhooks, notifyEnded } from './run-webhooks';

/**
 * Asked for by a Run whose spec the wire schema refuses, and only by such a Run: see refuseBadSpec.
 */
export const PATCH_SPEC_CHECKED = 'stasis-run-spec-checked';

/** A Run: one agent execution whose sandbox is released while it waits. */
export async function runWorkflow(input: RunWorkflowInput): Promise<unknown> {
  refuseBadSpec(input);
  const c = new RunController(input, workflowInfo().workflowId);
  setRunHandlers(c);
  c.changed();
  const main = new CancellationScope();
  const ttlScope = startTtlTimer(c, main);
  try {
    await main.run(() => agentLoop(c));
  } catch (err) {
    if (err instanceof ContinueAsNew) throw err;
    c.publishHeld();
    // A resume begun for the next job that never came: the sandbox is still where it was.
    undoPendingResume(c);
    if (c.ttlExpired) {
      await CancellationScope.nonCancellable(() => endTtl(c));
    } else if (isCancellation(err)) {
      await CancellationScope.nonCancellable(() => endCancelled(c));
      throw err;
    } else {
      await CancellationScope.nonCancellable(() =>
        endFailed(c, failureCode(err) ?? END_REASON.RUN_FAILED, failureMessage(err)),
      );
    }
  } finally {
    ttlScope?.cancel();
    await CancellationScope.nonCancellable(() => c.reporting);
    // Notified once the Run's status is final; the workflow closes once the receiver has them.
    if (isTerminal(c.run.status)) {
      notifyEnded(c);
      await CancellationScope.nonCancellable(() => drainWebhooks(c));
    }
  }
  return finalResult(c);
}

/**
 * A Run started straight through Temporal (past the client's and the API's wire schema; a `spawn`
 * action's spec is checked by its Update's validator) with a spec the wire schema refuses fails at
 * once, naming the field: one without a field the Run reads failed its first workflow task again and
 * again, RUNNING for good. A valid spec asks for no patch, so every valid Run's history is as before;
 * a Run started before the check with a spec it refuses (and that ran: it read no missing field)
 * finds no marker on replay and goes on as it did.
 */
function refuseBadSpec(input: RunWorkflowInput): void {
  if (input.carried) return; // checked when the Run started
  const [issue] = runSpecIssues(input.spec);
  if (!issue || !patched(PATCH_SPEC_CHECKED)) return;
  throw ApplicationFailure.create({
    type: 'INVALID_ARGUMENT',
    message: `${['spec', ...issue.path].join('.')}: ${issue.message}`,
    nonRetryable: true,
  });
}

/** policy.ttl ends the Run whatever its state: the timer cancels the main scope. */
function startTtlTimer(c: RunController, main: CancellationScope): CancellationScope | undefined {
  const ttl = c.run.spec.policy?.ttl;
  if (!ttl) return undefined;
  c.run.ttlDeadlineMs ??= nowMs() + durationMs(ttl);
  const scope = new CancellationScope();
  const remaining = Math.max(1, c.run.ttlDeadlineMs - nowMs());
  scope
    .run(() => sleep(remaining))
    .then(() => {
      c.ttlExpired = true;
      main.cancel();
    })
    .catch(() => undefined);
  return scope;
}
