import type { AgentStepOutput } from '../../drivers/api';
import { scriptedDriver } from '../../drivers/scripted';

/**
 * Drives the scripted driver over `steps` without a workflow, feeding it `results[i]` as the
 * result of its i-th action, until it completes or fails (20 steps at the most); every step it took.
 */
export async function walkScripted(steps: unknown[], results: unknown[]): Promise<AgentStepOutput[]> {
  const out: AgentStepOutput[] = [];
  let state: unknown;
  let lastResult: unknown;
  for (let i = 0; i < 20; i++) {
    const step = await scriptedDriver.step({ runId: 'r', agent: { steps }, state, lastResult });
    out.push(step);
    if (step.action.type === 'complete' || step.action.type === 'fail') break;
    state = step.state;
    lastResult = results[i];
  }
  return out;
}
