import { PENDING_MEMO } from '../common/interactions';
import { StasisResourceState, StasisStatus } from '../workflows/search-attributes';
import type { BenchEnv } from './env';
import { countTypes, historyStats, timedHistory } from './history';
import { cycleSpec, modeCases, newRunId, type ModeCase } from './specs';
import { sleep } from './stats';

// Figure 3: what one suspend/resume cycle costs in history, as the difference
// between a Run of 1 cycle and a Run of K cycles (so provisioning and the end
// of the Run cancel out), and how many cycles fit before Temporal suggests
// continue-as-new.

/** Temporal server defaults (common/dynamicconfig/constants.go): limit.historyCount.suggestContinueAsNew and limit.historySize.suggestContinueAsNew. */
export const SUGGEST_CAN_EVENTS = 4 * 1024;
export const SUGGEST_CAN_BYTES = 4 * 1024 * 1024;

export interface HistoryCost {
  name: string;
  /** Per cycle (ask → suspend → respond → resume → exec), one value per repetition: stable when all equal. */
  eventsPerCycle: number[];
  workflowTasksPerCycle: number[];
  bytesPerCycle: number[];
  /** Events/bytes of a 1-cycle Run outside its cycle. */
  baseEvents: number;
  baseBytes: number;
  /** Event types of one cycle (from the K-cycle minus 1-cycle difference). */
  typesPerCycle: Record<string, number>;
  cyclesBeforeContinueAsNew: number;
  limitedBy: 'events' | 'bytes';
  errors: string[];
}

async function runToEnd(
  env: BenchEnv,
  c: ModeCase,
  cycles: number,
): Promise<{ runId: string; events: number; bytes: number; types: Record<string, number> }> {
  const runId = newRunId(`hist-${cycles}`);
  await env.client.runs.start(cycleSpec(runId, c, env.scratch, cycles));
  let answered = 0;
  const handle = env.temporal.workflow.getHandle(runId);
  const deadline = Date.now() + 120_000;
  while (answered < cycles) {
    if (Date.now() > deadline) throw new Error(`run ${runId}: cycle ${answered + 1} never suspended`);
    const next = `int-${answered + 1}`;
    // By describe (search attributes and the memo of pending interactions), not by query: a query
    // reaching the Run while its local agent step runs ends that workflow task early, which added a
    // workflow task (3 events) to some cycles of the very count measured here.
    const described = await handle.describe();
    const asked = (described.memo?.[PENDING_MEMO] ?? []) as { id: string }[];
    const pending =
      described.typedSearchAttributes.get(StasisResourceState) === 'RELEASED' &&
      described.typedSearchAttributes.get(StasisStatus) === 'WAITING' &&
      asked.some((i) => i.id === next)
        ? next
        : undefined;
    if (pending) {
      await env.client.runs.respond(runId, pending, { decision: 'approve' });
      answered += 1;
    } else await sleep(25);
  }
  await handle.result();
  const stats = await historyStats(env.temporal, runId);
  return { runId, ...stats, types: countTypes(await timedHistory(env.temporal, runId)) };
}

export async function runHistoryCost(
  env: BenchEnv,
  reps: number,
  k: number,
  log: (line: string) => void,
): Promise<HistoryCost[]> {
  const results: HistoryCost[] = [];
  for (const c of modeCases(1).slice(0, 3)) {
    const cost: HistoryCost = {
      name: c.name,
      eventsPerCycle: [],
      workflowTasksPerCycle: [],
      bytesPerCycle: [],
      baseEvents: 0,
      baseBytes: 0,
      typesPerCycle: {},
      cyclesBeforeContinueAsNew: 0,
      limitedBy: 'events',
      errors: [],
    };
    for (let r = 0; r < reps; r++) {
      try {
        const one = await runToEnd(env, c, 1);
        const many = await runToEnd(env, c, k);
        const perEvents = (many.events - one.events) / (k - 1);
        const perBytes = (many.bytes - one.bytes) / (k - 1);
        cost.eventsPerCycle.push(perEvents);
        cost.bytesPerCycle.push(Math.round(perBytes));
        cost.workflowTasksPerCycle.push(
          ((many.types.WorkflowTaskCompleted ?? 0) - (one.types.WorkflowTaskCompleted ?? 0)) / (k - 1),
        );
        cost.baseEvents = one.events - perEvents;
        cost.baseBytes = Math.round(one.bytes - perBytes);
        cost.typesPerCycle = Object.fromEntries(
          Object.keys(many.types)
            .map((t) => [t, ((many.types[t] ?? 0) - (one.types[t] ?? 0)) / (k - 1)] as const)
            .filter(([, n]) => n !== 0),
        );
      } catch (err) {
        cost.errors.push(String(err));
      }
    }
    const events = Math.max(...cost.eventsPerCycle);
    const bytes = Math.max(...cost.bytesPerCycle);
    const byEvents = Math.floor((SUGGEST_CAN_EVENTS - cost.baseEvents) / events);
    const byBytes = Math.floor((SUGGEST_CAN_BYTES - cost.baseBytes) / bytes);
    cost.cyclesBeforeContinueAsNew = Math.min(byEvents, byBytes);
    cost.limitedBy = byEvents <= byBytes ? 'events' : 'bytes';
    log(
      `history ${c.name}: ${cost.eventsPerCycle.join('/')} events, ${cost.workflowTasksPerCycle.join('/')} workflow tasks, ${cost.bytesPerCycle.join('/')} bytes per cycle; ${cost.cyclesBeforeContinueAsNew} cycles before continue-as-new`,
    );
    results.push(cost);
  }
  return results;
}
