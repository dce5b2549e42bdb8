import { bundleWorkflowCode, NativeConnection, Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import type { temporal } from '@temporalio/proto';
import { CpuMeter, type CpuUse } from './cpu';
import type { BenchEnv } from './env';
import type { BareCycle, BareStep } from './bare-workflow';
import { answerWhenWaiting } from './fleet';
import { newRunId } from './specs';
import { mapLimit, round } from './stats';

// Figure 2's baseline: bare Temporal on the same server, with the same worker settings, running
// a workflow with the cycle's Update, activities and local activities in the same steps (read
// from a Stasis Run's history) and no sandbox work.

const QUEUE = 'bare';

/**
 * The steps of a Stasis Run's cycle, before and after its answer: what each of its workflow tasks
 * completed with (local activities, and activities by queue: host or shared), from its history.
 */
export function cycleShape(events: temporal.api.history.v1.IHistoryEvent[]): BareCycle {
  const cycle: BareCycle = { before: [], after: [] };
  let answered = false;
  let step: BareStep | undefined;
  const current = (): BareStep => {
    if (!step) {
      step = { local: 0, host: 0, shared: 0 };
      (answered ? cycle.after : cycle.before).push(step);
    }
    return step;
  };
  for (const e of events) {
    if (e.workflowTaskCompletedEventAttributes) step = undefined;
    if (e.workflowExecutionUpdateAcceptedEventAttributes) {
      answered = true;
      step = undefined;
    }
    if (e.markerRecordedEventAttributes?.markerName === 'core_local_activity') current().local += 1;
    const scheduled = e.activityTaskScheduledEventAttributes;
    if (scheduled) current()[(scheduled.taskQueue?.name ?? '').includes('@') ? 'host' : 'shared'] += 1;
  }
  return cycle;
}

export interface BareResult {
  concurrency: number;
  cycle: BareCycle;
  completed: number;
  wallMs: number;
  cyclesPerSecond: number;
  /** CPU seconds by part over the run, as the Stasis phase's: where the machine's cores went. */
  cpu: CpuUse;
}

let bundle: Promise<WorkflowBundleWithSourceMap> | undefined;

/** The bare workflow's bundle, built once per process: before a phase, not inside its profile (bench/throughput.ts). */
export function bareBundle(): Promise<WorkflowBundleWithSourceMap> {
  bundle ??= bundleWorkflowCode({
    workflowsPath: require.resolve('./bare-workflow'),
    logger: {
      log: () => undefined,
      trace: () => undefined,
      debug: () => undefined,
      info: () => undefined,
      warn: () => undefined,
      error: (m: string) => console.error(m),
    },
  });
  return bundle;
}

/** `concurrency` bare cycles started at once, each answered by its Update once it waits, until all completed. */
export async function runBare(
  env: BenchEnv,
  concurrency: number,
  cycle: BareCycle,
  timeoutMs = 600_000,
): Promise<BareResult> {
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
    workflowBundle: await bareBundle(),
  });
  const host = await Worker.create({ ...common, taskQueue: `${QUEUE}@host` });
  const running = Promise.all([workflows.run(), host.run()]);
  try {
    const ids = Array.from({ length: concurrency }, () => newRunId(`bare${concurrency}`));
    const cpu = new CpuMeter(env);
    const t0 = performance.now();
    let completed = 0;
    // All started (20 start calls in flight, as the Stasis phase does), each answered once visibility shows it
    // waiting, by the Stasis phase's own loop (answerWhenWaiting), then all awaited.
    const handles = await mapLimit(ids, 20, (id) =>
      env.temporal.workflow.start('bareCycleWorkflow', { taskQueue: QUEUE, workflowId: id, args: [cycle] }),
    );
    const errors = await answerWhenWaiting(
      env,
      ids,
      (id) => env.temporal.workflow.getHandle(id).executeUpdate('respond'),
      Date.now() + timeoutMs,
    );
    if (errors.length > 0) throw new Error(`bare Temporal: ${errors.length} answers failed: ${errors[0]}`);
    await Promise.all(
      handles.map(async (handle) => {
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
      cpu: cpu.stop(),
    };
  } finally {
    workflows.shutdown();
    host.shutdown();
    await running;
    await connection.close();
  }
}
