import {
  condition,
  defineUpdate,
  proxyActivities,
  proxyLocalActivities,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { StasisResourceState, StasisStatus } from '../workflows/search-attributes';

// The bare-Temporal baseline of figure 2: a workflow with the same Update and the same activities
// per cycle as a Stasis Run's cycle, in the same steps, doing no sandbox work.

export const bareRespond = defineUpdate<void, []>('respond');

/**
 * What one workflow task of the Run completed with: the local activities it ran (their markers),
 * then the activities it scheduled, on the host queue and on the shared one. Those of one step run
 * side by side, as the Run's did (its webhook delivery runs beside its release).
 */
export interface BareStep {
  local: number;
  host: number;
  shared: number;
}

export interface BareCycle {
  /** Steps before the Run waits for its answer, and after it. */
  before: BareStep[];
  after: BareStep[];
}

interface BareActivities {
  bareNoop(): Promise<void>;
}

export async function bareCycleWorkflow(cycle: BareCycle): Promise<string> {
  let waiting = false;
  let answered = false;
  setHandler(bareRespond, async () => {
    await condition(() => waiting);
    answered = true;
  });
  const queue = workflowInfo().taskQueue;
  // A task lost on its way to the worker (seen under load: started, never completed; once in most runs
  // at load 10) is retried after 10 s, not after the 10 minutes it once waited: shorter than a Stasis
  // provider call's 30 s heartbeat timeout, so a lost task costs the baseline less than it would a Run.
  const shared = proxyActivities<BareActivities>({ startToCloseTimeout: '10s' });
  const host = proxyActivities<BareActivities>({ taskQueue: `${queue}@host`, startToCloseTimeout: '10s' });
  const local = proxyLocalActivities<BareActivities>({ startToCloseTimeout: '30s' });
  const run = async (steps: BareStep[]) => {
    for (const step of steps) {
      for (let i = 0; i < step.local; i++) await local.bareNoop();
      await Promise.all([
        ...Array.from({ length: step.host }, () => host.bareNoop()),
        ...Array.from({ length: step.shared }, () => shared.bareNoop()),
      ]);
    }
  };
  await run(cycle.before);
  // Said as a Stasis Run says it (the attributes the driver polls): both are answered on the same signal.
  upsertSearchAttributes([
    { key: StasisStatus, value: 'WAITING' },
    { key: StasisResourceState, value: 'RELEASED' },
  ]);
  waiting = true;
  await condition(() => answered);
  await run(cycle.after);
  return 'done';
}
