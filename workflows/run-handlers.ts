import { condition, currentUpdateInfo, log, setHandler } from '@temporalio/workflow';
import type { ChildStateInput, InteractionRequest, RespondInput, RunSnapshot } from '../common/schemas';
import {
  childStateInputIssues,
  respondInputIssues,
  recordedRespondInputIssues,
  type WireIssue,
} from '../common/wire-checks';
import { describeIssues, type Rejection } from '../common/errors';
import { withRunLabels } from '../common/interactions';
import { nowIso, nowMs } from './clock';
import {
  childPingSignal,
  childStateSignal,
  resourceQuery,
  respondSignal,
  respondUpdate,
  legacyResumeRunUpdate,
  legacySuspendRunUpdate,
  resumeRunUpdate,
  snapshotQuery,
  suspendRunUpdate,
} from './definitions';
import { checkArity, checkRespond } from './lifecycle';
import { refuse } from './failures';
import {
  PATCH_RESPOND_RESULT_FITS,
  PATCH_RESUME_TAKEN,
  PATCH_SNAPSHOT_RESULT_FITS,
  type RunController,
} from './run-controller';
import { setExternalHandlers } from './run-external';
import {
  fitSnapshot,
  fitSnapshotResult,
  forgetContent,
  INTERACTION_PAYLOAD_MAX_BYTES,
  isTerminal,
  pendingInteractions,
  toResourceView,
  toSnapshot,
} from './run-state';
import { notify } from './run-webhooks';
import { jsonBytes } from '../common/payload-limits';

/** The Run's queries, updates and signals; set before the workflow's first await. */
export function setRunHandlers(c: RunController): void {
  const run = c.run;
  setHandler(snapshotQuery, () => fitSnapshot(toSnapshot(run)));
  setHandler(resourceQuery, () => toResourceView(run, nowMs(), c.waitingFor));
  setHandler(
    respondUpdate,
    (input) => {
      const check = checkAnswer(c, input, currentUpdateInfo()?.id, recordedRespondInputIssues);
      const interaction = run.interactions.find((i) => i.id === input.interactionId) as InteractionRequest;
      if (check !== 'duplicate') answer(c, input, currentUpdateInfo()?.id);
      const answered = withRunLabels(interaction, run.spec.labels);
      // Labels, reviewed action and answer may each be up to a megabyte: past the bound the result goes
      // without them (contentForgotten), not as a payload Temporal refuses (it terminated the Run).
      return jsonBytes(answered) > INTERACTION_PAYLOAD_MAX_BYTES && c.patched(PATCH_RESPOND_RESULT_FITS)
        ? forgetContent(answered)
        : answered;
    },
    {
      validator: (...args: unknown[]) => {
        const arity = checkArity('respond', args, 1);
        if (arity) refuse(arity);
        const check = checkAnswer(c, args[0], currentUpdateInfo()?.id, respondInputIssues);
        if (check && check !== 'duplicate') refuse(check);
      },
    },
  );
  setHandler(respondSignal, (input) => {
    const check = checkAnswer(c, input, undefined, recordedRespondInputIssues);
    if (check === undefined) answer(c, input, undefined);
    else
      log.warn('respondSignal rejected', {
        runId: run.runId,
        ...(check === 'duplicate' ? { code: 'DUPLICATE' } : check),
      });
  });
  for (const def of [suspendRunUpdate, legacySuspendRunUpdate]) {
    setHandler(
      def,
      async () => {
        c.manualSuspendRequested = true;
        await condition(() => run.phase === 'SUSPENDED' || isTerminal(run.status));
        return snapshotResult(c);
      },
      {
        validator: (...args: unknown[]) => {
          noArguments('suspend', args);
          const rejection = c.admit('suspend');
          if (rejection) refuse(rejection);
        },
      },
    );
  }
  for (const def of [resumeRunUpdate, legacyResumeRunUpdate]) {
    setHandler(
      def,
      async () => {
        c.resumeRequested = true;
        if (c.patched(PATCH_RESUME_TAKEN)) {
          const taken = c.resumesTaken;
          await condition(() => c.resumesTaken > taken || isTerminal(run.status));
        } else await condition(() => run.phase === 'ACTIVE' || isTerminal(run.status));
        return snapshotResult(c);
      },
      {
        validator: (...args: unknown[]) => {
          noArguments('resume', args);
          const rejection = c.admit('resume');
          if (rejection) refuse(rejection);
        },
      },
    );
  }
  setHandler(childStateSignal, (input) => {
    // Anyone can signal: a malformed report is logged and changes nothing.
    const issues = childStateInputIssues(input);
    if (issues.length) {
      log.warn('childState rejected', { runId: run.runId, message: describeIssues(issues) });
      return;
    }
    const { runId, state, status } = input as ChildStateInput;
    const child = run.children.find((ch) => ch.runId === runId);
    if (child) child.state = state;
    else run.children.push({ runId, state });
    if (status) run.childStatus[runId] = status;
    c.changed();
  });
  setHandler(childPingSignal, () => undefined);
  setExternalHandlers(c);
}

/** A suspend or resume Update's result: the snapshot, within the payload bound (PATCH_SNAPSHOT_RESULT_FITS). */
function snapshotResult(c: RunController): RunSnapshot {
  const snapshot = toSnapshot(c.run);
  return jsonBytes(snapshot) > INTERACTION_PAYLOAD_MAX_BYTES && c.patched(PATCH_SNAPSHOT_RESULT_FITS)
    ? fitSnapshotResult(snapshot)
    : snapshot;
}

/** `issuesOf`: the validator's check, or the one code that runs again on replay takes (wire-checks.ts). */
function checkAnswer(
  c: RunController,
  input: unknown,
  updateId: string | undefined,
  issuesOf: (input: unknown) => WireIssue[],
): Rejection | 'duplicate' | undefined {
  const issues = issuesOf(input);
  if (issues.length) return { code: 'INVALID_ARGUMENT', message: describeIssues(issues) };
  return checkRespond({ ...c.run, expiring: c.expiring }, input as RespondInput, updateId);
}

function answer(c: RunController, input: RespondInput, updateId: string | undefined): void {
  const interaction = c.run.interactions.find((i) => i.id === input.interactionId);
  if (!interaction) return;
  Object.assign(interaction, {
    status: 'answered',
    response: input.response,
    respondedBy: input.respondedBy ?? 'anonymous',
    respondedAt: nowIso(),
  });
  c.run.answeredBy[interaction.id] = updateId ? { updateId } : {};
  notify(c, 'interaction.answered', interaction);
  if (pendingInteractions(c.run).length === 0 && c.run.status === 'WAITING') c.transition('answered');
  else c.changed();
}

/** The Run's suspend and resume take no argument; junk in one is refused, not ignored. */
function noArguments(update: string, args: unknown[]): void {
  const arity = checkArity(update, args, 0);
  if (arity) refuse(arity);
}
