import { condition, defineUpdate, proxyActivities, setHandler, workflowInfo } from '@temporalio/workflow';

// The bare-Temporal baseline of figure 2: a workflow with the same number of Updates and
// host-queue activities per cycle as a Stasis Run's cycle, doing no sandbox work.

export const bareRespond = defineUpdate<void, []>('respond');

export interface BareCycle {
  /** Activities before the Run waits (on the host queue, and on the shared one). */
  hostBefore: number;
  sharedBefore: number;
  /** Activities after the answer. */
  hostAfter: number;
  sharedAfter: number;
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
  const shared = proxyActivities<BareActivities>({ startToCloseTimeout: '10m' });
  const host = proxyActivities<BareActivities>({ taskQueue: `${queue}@host`, startToCloseTimeout: '10m' });
  for (let i = 0; i < cycle.sharedBefore; i++) await shared.bareNoop();
  for (let i = 0; i < cycle.hostBefore; i++) await host.bareNoop();
  waiting = true;
  await condition(() => answered);
  for (let i = 0; i < cycle.sharedAfter; i++) await shared.bareNoop();
  for (let i = 0; i < cycle.hostAfter; i++) await host.bareNoop();
  return 'done';
}
