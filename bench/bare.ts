import { NativeConnection, Worker } from '@temporalio/worker';
import type { temporal } from '@temporalio/proto';
import type { BenchEnv } from './env';
import type { BareCycle } from './bare-workflow';
import { newRunId } from './specs';
import { mapLimit, round } from './stats';

// Figure 2's baseline: bare Temporal on the same server, with the same worker settings, running
// a workflow with the cycle's Updates and activities (counted from a Stasis Run's history) and
// no sandbox work.

const QUEUE = 'bare';

/** The activities of a Stasis Run, before and after its answer, by queue (host or shared). */
export function cycleShape(events: temporal.api.history.v1.IHistoryEvent[]): BareCycle {
  const cycle: BareCycle = { hostBefore: 0, sharedBefore: 0, hostAfter: 0, sharedAfter: 0 };
  let answered = false;
  for (const e of events) {
    if (e.workflowExecutionUpdateAcceptedEventAttributes) answered = true;
    const scheduled = e.activityTaskScheduledEventAttributes;
    if (!scheduled) continue;
    const onHost = (scheduled.taskQueue?.name ?? '').includes('@');
    const key = `${onHost ? 'host' : 'shared'}${answered ? 'After' : 'Before'}` as keyof BareCycle;
    cycle[key] += 1;
  }
  return cycle;
}

export interface BareResult {
  concurrency: number;
  cycle: BareCycle;
  completed: number;
  wallMs: number;
  cyclesPerSecond: number;
}

/** `concurrency` bare cycles started at once, each answered by its Update, until all completed. */
export async function runBare(env: BenchEnv, concurrency: number, cycle: BareCycle): Promise<BareResult> {
  const connection = await NativeConnection.connect(env.config.temporal.connectionOptions);
  const activities = { bareNoop: async () => undefined };
  const common = {
    connection,
    namespace: env.config.TEMPORAL_NAMESPACE,
    activities,
    maxCachedWorkflows: env.config.STASIS_MAX_CACHED_WORKFLOWS,
  };
  const workflows = await Worker.create({
    ...common,
    taskQueue: QUEUE,
    workflowsPath: require.resolve('./bare-workflow'),
  });
  const host = await Worker.create({ ...common, taskQueue: `${QUEUE}@host` });
  const running = Promise.all([workflows.run(), host.run()]);
  try {
    const ids = Array.from({ length: concurrency }, () => newRunId(`bare${concurrency}`));
    const t0 = performance.now();
    let completed = 0;
    // All started (20 start calls in flight, as the Stasis phase does), then all answered and awaited at once.
    const handles = await mapLimit(ids, 20, (id) =>
      env.temporal.workflow.start('bareCycleWorkflow', { taskQueue: QUEUE, workflowId: id, args: [cycle] }),
    );
    await Promise.all(
      handles.map(async (handle) => {
        await handle.executeUpdate('respond');
        if ((await handle.result()) === 'done') completed += 1;
      }),
    );
    const wallMs = performance.now() - t0;
    return {
      concurrency,
      cycle,
      completed,
      wallMs: Math.round(wallMs),
      cyclesPerSecond: round(completed / (wallMs / 1000), 2),
    };
  } finally {
    workflows.shutdown();
    host.shutdown();
    await running;
    await connection.close();
  }
}
