import { condition, setHandler, workflowInfo } from '@temporalio/workflow';
import { actionBodyHash, actionRequestProblem, EXTERNAL_DRIVER } from '../common/external-actions';
import type { ActionRequest, ActionView, ExternalAction, RunError } from '../common/schemas';
import { actionQuery, actUpdate } from './definitions';
import { admitAction, checkArity } from './lifecycle';
import { refuse } from './failures';
import type { RunController } from './run-controller';
import { isTerminal, toAnswer, type SessionAggregate } from './run-state';

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
  /** Length of the result's JSON, counted once, for the result budget. */
  resultChars?: number;
  resultForgotten?: boolean;
}

/** How many recent actionIds a Run remembers (with their outcome), also across continue-as-new. */
export const RECENT_ACTIONS = 1_000;
/**
 * How much of their results it keeps (JSON characters, newest first; the newest is
 * always kept): a retry of a recent action gets its result, and the aggregate
 * continue-as-new carries stays well inside a Temporal payload.
 */
export const RESULT_BUDGET_CHARS = 512 * 1024;

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

/** What an action says once settled; the Run forgets old results past its budget. */
export function settleAction(
  run: SessionAggregate,
  entry: ActionEntry,
  outcome: { result: unknown } | { error: RunError },
): void {
  delete entry.action;
  if ('error' in outcome) {
    entry.status = 'failed';
    entry.error = outcome.error;
  } else {
    entry.status = 'succeeded';
    entry.result = outcome.result;
    entry.resultChars = JSON.stringify(outcome.result ?? null).length;
  }
  run.actions = boundActions(run.actions ?? []);
}

/** The newest RECENT_ACTIONS entries; results kept newest first within RESULT_BUDGET_CHARS. */
export function boundActions(actions: ActionEntry[]): ActionEntry[] {
  const kept = actions.slice(-RECENT_ACTIONS);
  let chars = 0;
  for (let i = kept.length - 1; i >= 0; i--) {
    const entry = kept[i];
    if (entry.result === undefined || entry.resultChars === undefined) continue;
    chars += entry.resultChars;
    if (chars > RESULT_BUDGET_CHARS && i < kept.length - 1) {
      delete entry.result;
      delete entry.resultChars;
      entry.resultForgotten = true;
    }
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
