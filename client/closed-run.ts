import type { Client } from '@temporalio/client';
import { END_REASON } from '../common/errors';
import type { ActionView, RunSnapshot } from '../common/schemas';

// A Run whose workflow Temporal closed without the Run's own end (terminated in Temporal Web,
// or a workflow timeout): its last state still says RUNNING or WAITING, so the client reports
// it ended (docs/DESIGN.md, Runs: such a Run counts as FAILED, as its parent counts a child so).

/** True when a workflow in this status has closed: anything but running (a continue-as-new goes on). */
export function workflowClosed(status: string): boolean {
  return status !== 'RUNNING' && status !== 'CONTINUED_AS_NEW';
}

/** temporal.api.enums.v1.HistoryEventFilterType: only the close event (the proto package is no dependency of ours). */
const HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT = 2;

/** Why Temporal closed the workflow, from its close event: the termination's reason and who gave it. */
export async function closeReason(client: Client, runId: string, status: string): Promise<string> {
  const said = status === 'TIMED_OUT' ? 'timed out in Temporal' : `was ${status.toLowerCase()} in Temporal`;
  try {
    const { history } = await client.workflowService.getWorkflowExecutionHistory({
      namespace: client.options.namespace,
      execution: { workflowId: runId },
      historyEventFilterType: HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT,
    });
    const terminated = history?.events?.[0]?.workflowExecutionTerminatedEventAttributes;
    if (terminated) {
      const by = terminated.identity ? ` by ${terminated.identity}` : '';
      return `its workflow was terminated in Temporal${by}${terminated.reason ? `: ${terminated.reason}` : ''}`;
    }
  } catch {
    // The reason is a courtesy: the status says enough.
  }
  return `its workflow ${said}`;
}

/** The Run as it ended: FAILED with RUN_FAILED and why, its pending interactions cancelled (no answer is taken). */
export function endedOutside(snapshot: RunSnapshot, why: string): RunSnapshot {
  return {
    ...snapshot,
    status: 'FAILED',
    interactions: snapshot.interactions.map((i) => (i.status === 'pending' ? { ...i, status: 'cancelled' } : i)),
    error: { code: END_REASON.RUN_FAILED, message: `the Run ended without its own end: ${why}` },
  };
}

/** An action that has its outcome (succeeded or failed), not one under way (running, or waiting on a person). */
export function isSettled(view: ActionView): boolean {
  return view.status === 'succeeded' || view.status === 'failed';
}

/** An action under way when its Run's workflow closed: failed with the Run's reason, as for any ended Run. */
export function actionEndedOutside(view: ActionView, why: string): ActionView {
  return {
    ...view,
    status: 'failed',
    error: { code: END_REASON.RUN_FAILED, message: `the run ended FAILED before the action finished: ${why}` },
  };
}
