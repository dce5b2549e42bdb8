import { bareBundle, cycleShape, runBare, type BareResult } from './bare';
import { CpuMeter, type CpuUse } from './cpu';
import { analyseCycle } from './cycle';
import type { BenchEnv } from './env';
import { answerWhenWaiting, settle } from './fleet';
import { timedHistory } from './history';
import { leftovers, type Leftovers } from './leftovers';
import { profiled, type ProfileSummary } from './profile';
import { PeakRss } from './rss';
import { scrapeSdk, sdkDelta, type SdkLatency } from './sdk-metrics';
import { cycleSpec, newRunId, type ModeCase } from './specs';
import { mapLimit, round, summarize, type Summary } from './stats';

// Figure 2: full cycles per second with N concurrent Runs on one worker.

export interface ThroughputResult {
  concurrency: number;
  /** How the Runs released their sandbox: SNAPSHOT_AND_TERMINATE, or DETACH for the orchestration-only row. */
  mode: ModeCase['mode'];
  completed: number;
  failed: number;
  wallMs: number;
  cyclesPerSecond: number;
  peakRssMiB: number;
  /** Suspend/resume latency under this load, from the histories of a sample of the Runs. */
  suspendMs: Summary;
  resumeMs: Summary;
  sdk: Record<string, SdkLatency>;
  leftovers: Leftovers;
  /** Why Runs did not complete, with counts. */
  failures: Record<string, number>;
  errors: string[];
  /** CPU seconds by process and worker thread over the phase. */
  cpu: CpuUse;
  /** Where the worker's main thread spent this phase (the first size only). */
  profile?: ProfileSummary;
  /** Bare Temporal at the same concurrency (bench/bare-workflow.ts), right after, and Stasis cycles/s ÷ bare cycles/s. */
  bare?: BareResult;
  ratioToBare?: number;
}

/** Figure 2's Run: released with a snapshot of a 4 KiB workspace (DETACH for the orchestration-only row). */
const caseOf = (mode: ModeCase['mode']): ModeCase => ({ name: 'throughput', mode, bytes: 4096 });

export async function runThroughput(
  env: BenchEnv,
  concurrency: number,
  timeoutMs: number,
  log: (line: string) => void,
  options: { profile?: boolean; mode?: ModeCase['mode'] } = {},
): Promise<ThroughputResult> {
  // Built before the phase: bundling is the baseline's set-up, neither in its time nor in the profile of the Stasis phase.
  await bareBundle();
  const measure = async <T>(fn: () => Promise<T>): Promise<{ value: T; profile?: ProfileSummary }> =>
    options.profile ? profiled(fn) : { value: await fn() };
  const mode = options.mode ?? 'SNAPSHOT_AND_TERMINATE';
  const { value: phase, profile } = await measure(() => stasisPhase(env, concurrency, timeoutMs, caseOf(mode)));
  const { ids, errors, completed, failed, failures, wallMs, peakRssMiB, cpuUse, sdk } = phase;
  const sample = ids.slice(0, Math.min(10, ids.length));
  const analysed = await Promise.all(
    sample.map(async (id) => {
      try {
        return analyseCycle(await timedHistory(env.temporal, id));
      } catch {
        return undefined;
      }
    }),
  );
  const ok = analysed.filter((a) => a !== undefined);
  let bare: BareResult | undefined;
  try {
    const history = await env.temporal.workflow.getHandle(ids[0]).fetchHistory();
    bare = await runBare(env, concurrency, cycleShape(history.events ?? []), timeoutMs);
    log(
      `bare Temporal ${concurrency}: ${bare.completed} completed in ${bare.wallMs} ms = ${bare.cyclesPerSecond} cycles/s`,
    );
  } catch (err) {
    errors.push(`bare-Temporal baseline: ${String(err)}`);
  }
  const result: ThroughputResult = {
    concurrency,
    mode,
    completed,
    failed,
    wallMs: Math.round(wallMs),
    cyclesPerSecond: round(completed / (wallMs / 1000), 2),
    peakRssMiB,
    suspendMs: summarize(ok.map((a) => a.suspendMs)),
    resumeMs: summarize(ok.map((a) => a.resumeMs)),
    sdk,
    cpu: cpuUse,
    leftovers: await leftovers(env),
    failures,
    errors: errors.slice(0, 5),
    ...(profile ? { profile } : {}),
    ...(bare
      ? { bare, ratioToBare: round(completed / (wallMs / 1000) / Math.max(0.001, bare.cyclesPerSecond), 2) }
      : {}),
  };
  log(
    `throughput ${concurrency} (${mode}): ${completed} completed, ${failed} failed in ${result.wallMs} ms = ${result.cyclesPerSecond} cycles/s, peak RSS ${peakRssMiB} MiB, ` +
      `leftover processes ${result.leftovers.processes}, workspaces ${result.leftovers.workspaces}` +
      (errors.length ? `; ${errors.length} errors: ${errors[0]}` : ''),
  );
  return result;
}

/** The Stasis part of the phase: N Runs started at once, each answered once released, until all closed. */
async function stasisPhase(env: BenchEnv, concurrency: number, timeoutMs: number, runCase: ModeCase) {
  const errors: string[] = [];
  const ids = Array.from({ length: concurrency }, () => newRunId(`tp${concurrency}`));
  const idSet = new Set(ids);
  const before = await scrapeSdk(env.sdkMetricsUrl);
  const rss = new PeakRss();
  const cpu = new CpuMeter(env);
  const t0 = performance.now();
  const deadline = Date.now() + timeoutMs;
  await mapLimit(ids, 20, (id) =>
    env.client.runs.start(cycleSpec(id, runCase, env.scratch)).catch((err: unknown) => errors.push(String(err))),
  );
  const answer = (id: string) => env.client.runs.respond(id, 'int-1', { decision: 'approve' });
  for (const e of await answerWhenWaiting(env, ids, answer, deadline)) errors.push(e);
  const { completed, failed, failures } = await settle(env, idSet, deadline, 200);
  const wallMs = performance.now() - t0;
  const peakRssMiB = rss.stop();
  const cpuUse = cpu.stop();
  const sdk = sdkDelta(before, await scrapeSdk(env.sdkMetricsUrl));
  return { ids, errors, completed, failed, failures, wallMs, peakRssMiB, cpuUse, sdk };
}
