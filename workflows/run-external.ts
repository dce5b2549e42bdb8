import { condition, setHandler, workflowInfo } from '@temporalio/workflow';
import { actionBodyHash, actionRequestProblem, EXTERNAL_DRIVER } from '../common/external-actions';
import type { ActionRequest, ActionView, ExternalAction, RunError } from '../common/schemas';
import { actionQuery, actUpdate } from './definitions';
import { admitAction, checkArity } from './lifecycle';
import { refuse } from './failures';
import type { RunController } from './run-controller';
import { isTerminal, toAnswer, type SessionAggregate } from './run-state';
import { utf8Length } from '../common/payload-limits';

// The external driver's side of a Run: the agent is a program outside the worker
// that sends one action at a time (the `act` Update); the agent loop waits for it
// durably (a condition, no polling), performs it, and keeps its result for retries.

/** One action the Run was sent: `pending` until the agent loop takes it up. */
export interface ActionEntry {
  actionId: string;
  type: ExternalAction['type'];
  bodyHash: string;
  status: 'pending' | ActionView['status'];
  /** The action itself, until it has been performed. */
  action?: ExternalAction;
  interactionId?: string;
  result?: unknown;
  error?: RunError;
  /** Length of the result's JSON in UTF-16 code units (Runs before PATCH_RESULT_BYTES). */
  resultChars?: number;
  /** UTF-8 bytes of the result's JSON, counted once, for the result budget. */
  resultBytes?: number;
  resultForgotten?: boolean;
}

/** How many recent actionIds a Run remembers (with their outcome), also across continue-as-new. */
export const RECENT_ACTIONS = 1_000;
/**
 * How much of their results it keeps (UTF-8 bytes of JSON, as Temporal counts a payload; newest
 * first; the newest is always kept, until continue-as-new needs the room: fitContinueInput): a retry
 * of a recent action gets its result, and the aggregate continue-as-new carries stays well inside a
 * Temporal payload.
 */
export const RESULT_BUDGET_BYTES = 512 * 1024;

/**
 * The result budget counts UTF-8 bytes: it counted UTF-16 code units, so results of non-ASCII text
 * (768 KB of "€" is 256,000 units) kept three times the budget, and continue-as-new with them was
 * over Temporal's limit (the Run terminated). Asked only when the two counts keep different results.
 */
export const PATCH_RESULT_BYTES = 'stasis-run-result-bytes';

const isExternal = (run: SessionAggregate): boolean => run.spec.agent.driver === EXTERNAL_DRIVER;
const findAction = (run: SessionAggregate, actionId: string): ActionEntry | undefined =>
  run.actions?.find((a) => a.actionId === actionId);
const unsettled = (a: ActionEntry): boolean => a.status !== 'succeeded' && a.status !== 'failed';

/** The `act` Update and the `action` query; set before the workflow's first await. */
export function setExternalHandlers(c: RunController): void {
  const run = c.run;
  setHandler(
    actUpdate,
    (input) => {
      const known = findAction(run, input.actionId);
      if (known) return actionView(known, run);
      const entry: ActionEntry = {
        actionId: input.actionId,
        type: input.action.type,
        bodyHash: actionBodyHash(input.action),
        status: 'pending',
        action: input.action,
      };
      (run.actions ??= []).push(entry);
      return actionView(entry, run);
    },
    {
      validator: (...args: unknown[]) => {
        const arity = checkArity('act', args, 1);
        if (arity) refuse(arity);
        const problem = actionRequestProblem(args[0]);
        if (problem) refuse({ code: 'INVALID_ARGUMENT', message: `${problem.path}: ${problem.message}` });
        const input = args[0] as ActionRequest;
        const known = findAction(run, input.actionId);
        const rejection = admitAction(
          {
            status: run.status,
            phase: run.phase,
            external: isExternal(run),
            expiring: c.expiring,
            ending: c.completed !== undefined,
            suspendRequested: c.manualSuspendRequested,
            ...(run.actions?.some(unsettled) ? { inProgress: run.actions.find(unsettled)!.actionId } : {}),
            ...(known ? { known: { actionId: known.actionId, bodyHash: known.bodyHash } } : {}),
          },
          actionBodyHash(input.action),
        );
        if (rejection && rejection !== 'duplicate') refuse(rejection);
      },
    },
  );
  setHandler(actionQuery, (actionId) => {
    const entry = typeof actionId === 'string' ? findAction(run, actionId) : undefined;
    return entry ? actionView(entry, run) : null;
  });
}

/**
 * Waits (durably) until the agent sends an action, and returns it; or undefined
 * when the loop has something else to do first (a manual suspend, continue-as-new).
 */
export async function nextAction(c: RunController): Promise<ActionEntry | undefined> {
  const pending = () => c.run.actions?.find((a) => a.status === 'pending');
  await condition(
    () =>
      pending() !== undefined ||
      c.manualSuspendRequested ||
      (workflowInfo().continueAsNewSuggested && c.admit('continueAsNew') === undefined),
  );
  return pending();
}

/**
 * What an action says once settled; the Run forgets old results past its budget. `isPatched`:
 * patched() as the Run decides it (RunController.patched).
 */
export function settleAction(
  run: SessionAggregate,
  entry: ActionEntry,
  outcome: { result: unknown } | { error: RunError },
  isPatched: (patchId: string) => boolean,
): void {
  delete entry.action;
  if ('error' in outcome) {
    entry.status = 'failed';
    entry.error = outcome.error;
  } else {
    const json = JSON.stringify(outcome.result ?? null);
    entry.status = 'succeeded';
    entry.result = outcome.result;
    entry.resultChars = json.length;
    entry.resultBytes = utf8Length(json);
  }
  const actions = run.actions ?? [];
  const inBytes = forgottenBy(actions, 'bytes');
  run.actions = boundActions(
    actions,
    sameSet(inBytes, forgottenBy(actions, 'chars')) || isPatched(PATCH_RESULT_BYTES) ? 'bytes' : 'chars',
  );
}

/** How an entry's result is counted: UTF-8 bytes, or UTF-16 code units (Runs before PATCH_RESULT_BYTES). */
type ResultUnit = 'bytes' | 'chars';

/** The size of an entry's result in `unit`; undefined for one without a result (or a count). */
function resultSize(entry: ActionEntry, unit: ResultUnit): number | undefined {
  if (entry.result === undefined) return undefined;
  if (unit === 'chars') return entry.resultChars;
  // Entries settled before resultBytes was kept (carried across continue-as-new) are measured now.
  return entry.resultBytes ?? (entry.resultChars === undefined ? undefined : utf8Length(JSON.stringify(entry.result)));
}

/** Indexes (in the newest RECENT_ACTIONS) whose results boundActions would forget, counting in `unit`. */
function forgottenBy(actions: ActionEntry[], unit: ResultUnit): number[] {
  return keptResults(actions.slice(-RECENT_ACTIONS), unit).forget;
}

const sameSet = (a: number[], b: number[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * Of `kept` (oldest first), the indexes whose results go: newest first within RESULT_BUDGET_BYTES (or
 * RESULT_BUDGET_BYTES code units, before PATCH_RESULT_BYTES), the newest always kept.
 */
export function keptResults(kept: ActionEntry[], unit: ResultUnit): { forget: number[] } {
  const forget: number[] = [];
  let used = 0;
  for (let i = kept.length - 1; i >= 0; i--) {
    const size = resultSize(kept[i], unit);
    if (size === undefined) continue;
    used += size;
    if (used > RESULT_BUDGET_BYTES && i < kept.length - 1) forget.push(i);
  }
  return { forget };
}

/** The newest RECENT_ACTIONS entries; results kept newest first within RESULT_BUDGET_BYTES (keptResults). */
export function boundActions(actions: ActionEntry[], unit: ResultUnit = 'bytes'): ActionEntry[] {
  const kept = actions.slice(-RECENT_ACTIONS);
  for (const i of keptResults(kept, unit).forget) {
    const entry = kept[i];
    delete entry.result;
    delete entry.resultChars;
    delete entry.resultBytes;
    entry.resultForgotten = true;
  }
  return kept;
}

/** The agent-facing view: an action the Run ended under is failed with the Run's reason. */
export function actionView(entry: ActionEntry, run: SessionAggregate): ActionView {
  const ended = unsettled(entry) && isTerminal(run.status);
  return {
    actionId: entry.actionId,
    type: entry.type,
    status: ended ? 'failed' : entry.status === 'pending' ? 'running' : entry.status,
    bodyHash: entry.bodyHash,
    ...(entry.interactionId ? { interactionId: entry.interactionId } : {}),
    ...(entry.result !== undefined ? { result: entry.result } : {}),
    ...(entry.error ? { error: entry.error } : {}),
    ...(ended
      ? {
          error: {
            code: run.error?.code ?? `RUN_${run.status}`,
            message: `the run ended ${run.status} before the action finished`,
          },
        }
      : {}),
    ...(entry.resultForgotten ? { resultForgotten: true } : {}),
  };
}

/** The answer an external agent gets for its ask: the interaction's answer, once it has one. */
export function answerOf(run: SessionAggregate, interactionId: string | undefined): unknown {
  const interaction = run.interactions.find((i) => i.id === interactionId);
  return interaction?.status === 'answered' ? toAnswer(interaction) : undefined;
}
