import { randomUUID } from 'node:crypto';
import { statSync } from 'node:fs';
import * as path from 'node:path';
import type { RunSpec } from '../common/schemas';
import { CpuMeter, type CpuUse } from './cpu';
import type { BenchEnv } from './env';
import { countReleased, releasedAmong, respondAll, settle, waitReleased } from './fleet';
import { leftovers, sandboxProcessCount, type Leftovers } from './leftovers';
import { perRun, workerMemory, type WorkerMemory } from './memory';
import { PeakRss, rssMiB } from './rss';
import { scrapeSdk, sdkDelta, type SdkLatency } from './sdk-metrics';
import { newRunId } from './specs';
import { mapLimit, round, sleep } from './stats';

// Figure 5: N Runs suspended at once (TERMINATE on an active workspace, so no
// process is held), what holding them costs, and how long answering all takes.

export interface WaitingResult {
  /** Runs planned; Runs suspended and waiting together (what the figures are for); Runs started. */
  target: number;
  runs: number;
  started?: number;
  /** Why fewer than `target` Runs waited (the ramp's end, the time left, Runs still suspending at the cutoff). */
  shortBecause?: string;
  /** Starting all Runs until every one is suspended with its compute released. */
  suspendAllMs: number;
  /** While all are suspended: sandbox processes of the worker's host (must be 0). */
  processesHeld: number;
  /** The worker's RSS before the phase started a Run (0 Runs), while all waited, and after all completed. */
  rssBaseMiB: number;
  rssWhileWaitingMiB: number;
  rssAfterMiB: number;
  /** (RSS while waiting − RSS with 0 Runs) / Runs: with what the first Runs warmed up (JIT, buffers, heaps grown). */
  perRunMiB: number;
  /**
   * The worker's memory by part (after a full GC) with 0 Runs, once half the Runs were
   * suspended, and with all; and what each Run of the second half added: the marginal cost of
   * one more waiting Run, without the warm-up.
   */
  memory?: { base: WorkerMemory; half: WorkerMemory; halfRuns: number; all: WorkerMemory; perRun: WorkerMemory };
  peakRssMiB: number;
  /** Dev server's SQLite file (+ WAL) while all are waiting, and its growth over the phase. */
  databaseMiB: number;
  databaseGrowthMiB: number;
  /** Sending every answer (respond updates, 50 in flight) ... */
  answerAllMs: number;
  /** ... and until every Run completed (restore, exec, complete, destroy). */
  completeAllMs: number;
  answersPerSecond: number;
  completed: number;
  failed: number;
  sdk: Record<string, SdkLatency>;
  /** CPU seconds by process and worker thread while suspending, and while answering and completing. */
  cpuSuspending: CpuUse;
  cpuAnswering: CpuUse;
  leftovers: Leftovers;
  /** Why Runs did not complete, with counts. */
  failures: Record<string, number>;
  errors: string[];
}

/**
 * Answering and completing a Run (restore, exec, complete, destroy) takes this many times as long
 * as suspending it: 1.35 in the last quick run (57.5 s against 42.7 s for 386 Runs), 1.2 in a full one.
 */
const ANSWER_TO_SUSPEND = 1.35;

function databaseMiB(env: BenchEnv): number {
  let bytes = 0;
  for (const suffix of ['', '-wal', '-shm']) {
    try {
      bytes += statSync(path.join(env.dataDir, `temporal.sqlite${suffix}`)).size;
    } catch {
      // absent
    }
  }
  return bytes / (1024 * 1024);
}

function waitingSpec(runId: string, scratch: string): RunSpec {
  return {
    runId,
    agent: {
      driver: 'scripted',
      steps: [{ ask: 'Approve?' }, { exec: 'echo approved > approved.txt' }, { complete: 'done' }],
    },
    sandbox: { provider: 'local', workspace: { kind: 'active', hostPath: path.join(scratch, 'waiting', runId) } },
  };
}

/** Starts up to `target` Runs until `rampMs` has passed, then answers all that were started. */
export async function runWaiting(
  env: BenchEnv,
  target: number,
  rampMs: number,
  timeoutMs: number,
  log: (line: string) => void,
): Promise<WaitingResult> {
  const errors: string[] = [];
  const rssBaseMiB = Math.round(rssMiB());
  const memoryBase = await workerMemory();
  const dbBefore = databaseMiB(env);
  const before = await scrapeSdk(env.sdkMetricsUrl);
  const rss = new PeakRss();
  const cpuSuspending = new CpuMeter(env);
  const deadline = Date.now() + timeoutMs;
  // A prefix of this phase's own: its visibility polls count its Runs, not an earlier phase's.
  const tag = `wait${randomUUID().slice(0, 4)}`;
  const planned = Array.from({ length: target }, () => newRunId(tag));
  const ids: string[] = [];
  const t0 = performance.now();
  const rampEnd = Date.now() + rampMs;
  // A bounded window of Runs not yet released, topped up as they release: the host never runs
  // thousands of sandboxes' init processes at once, and never idles between batches either.
  const WINDOW = 150;
  let released = 0;
  const all = new Set(planned);
  const steps: { memory: WorkerMemory; runs: number }[] = [];
  // Starting stops at the ramp's end, or earlier once the Runs started so far could no longer be
  // suspended, answered and completed before the deadline at the rate seen so far.
  const fits = () => {
    const elapsed = performance.now() - t0;
    if (released < WINDOW || elapsed <= 0) return true;
    const rest = (ids.length - released) * perRunMs() + ids.length * perRunMs() * ANSWER_TO_SUSPEND;
    return Date.now() + rest < deadline - 10_000;
  };
  const perRunMs = () => (performance.now() - t0) / Math.max(1, released);
  while (ids.length < planned.length && Date.now() < rampEnd && fits()) {
    const room = WINDOW - (ids.length - released);
    if (room >= 25) {
      const batch = planned.slice(ids.length, ids.length + room);
      ids.push(...batch);
      await mapLimit(batch, 20, (id) =>
        env.client.runs.start(waitingSpec(id, env.scratch)).catch((err: unknown) => errors.push(String(err))),
      );
    }
    await sleep(1000);
    released = await countReleased(env, all);
    // Every eighth of the plan: the one nearest half of the Runs the ramp reaches is the midpoint.
    if (released >= ((steps.length + 1) * target) / 8 && steps.length < 7)
      steps.push({ memory: await workerMemory(), runs: released });
  }
  const rampStop =
    ids.length === planned.length
      ? undefined
      : Date.now() >= rampEnd
        ? `the ${Math.round(rampMs / 1000)} s ramp ended after ${ids.length} Runs were started`
        : `starting stopped at ${ids.length} Runs: at ${Math.round(perRunMs())} ms per suspended Run, more could not be suspended, answered and completed in the phase's time`;
  const idSet = new Set(ids);
  // Those started are waited for only as long as answering and completing them still fits: past
  // that, the figures are for the Runs that were waiting together (a run under load used to throw
  // them all away here).
  const answerMs = ids.length * perRunMs() * ANSWER_TO_SUSPEND;
  released = await waitReleased(env, idSet, Math.max(Date.now() + 10_000, deadline - answerMs - 10_000), 1000);
  const suspendAllMs = performance.now() - t0;
  const waitingIds = await releasedAmong(env, idSet);
  const runs = waitingIds.length;
  const stillSuspending = ids.length - runs;
  const shortBecause = [
    ...(rampStop ? [rampStop] : []),
    ...(stillSuspending > 0
      ? [
          `${stillSuspending} of the ${ids.length} started were not yet suspended when answering had to begin (${Math.round(suspendAllMs / 1000)} s after the first start); they are answered if they suspend before the phase's deadline`,
        ]
      : []),
  ].join('; ');
  const suspendingCpu = cpuSuspending.stop();
  const processesHeld = await sandboxProcessCount();
  const rssWhileWaitingMiB = Math.round(rssMiB());
  const memoryAll = await workerMemory();
  const half = steps
    .filter((step) => step.runs < runs)
    .sort((a, b) => Math.abs(a.runs - runs / 2) - Math.abs(b.runs - runs / 2))[0];
  const dbWaiting = databaseMiB(env);
  if (shortBecause) log(`waiting: ${runs} of ${target} planned Runs waiting together: ${shortBecause}`);
  log(
    `waiting: ${runs} Runs suspended in ${Math.round(suspendAllMs)} ms, ${processesHeld} processes held, RSS ${rssBaseMiB} → ${rssWhileWaitingMiB} MiB, database ${round(dbWaiting)} MiB`,
  );

  const t1 = performance.now();
  const cpuAnswering = new CpuMeter(env);
  for (const e of await respondAll(env, waitingIds, 50, deadline)) errors.push(e);
  const answerAllMs = performance.now() - t1;
  // The stragglers, if they suspended meanwhile: answered too, so no Run is left waiting for ever.
  if (stillSuspending > 0) {
    const answered = new Set(waitingIds);
    const late = (await releasedAmong(env, idSet)).filter((id) => !answered.has(id));
    for (const e of await respondAll(env, late, 50, deadline)) errors.push(e);
  }
  const { completed, failed, failures } = await settle(env, idSet, deadline, 500);
  const completeAllMs = performance.now() - t1;
  const answeringCpu = cpuAnswering.stop();
  const result: WaitingResult = {
    target,
    runs,
    started: ids.length,
    ...(shortBecause ? { shortBecause } : {}),
    suspendAllMs: Math.round(suspendAllMs),
    processesHeld,
    rssBaseMiB,
    rssWhileWaitingMiB,
    rssAfterMiB: Math.round(rssMiB()),
    perRunMiB: runs > 0 ? round((rssWhileWaitingMiB - rssBaseMiB) / runs, 3) : 0,
    ...(half && runs > half.runs
      ? {
          memory: {
            base: memoryBase,
            half: half.memory,
            halfRuns: half.runs,
            all: memoryAll,
            perRun: perRun(half.memory, memoryAll, runs - half.runs),
          },
        }
      : {}),
    peakRssMiB: rss.stop(),
    databaseMiB: round(dbWaiting),
    databaseGrowthMiB: round(dbWaiting - dbBefore),
    answerAllMs: Math.round(answerAllMs),
    completeAllMs: Math.round(completeAllMs),
    answersPerSecond: round(runs / (answerAllMs / 1000)),
    completed,
    failed,
    sdk: sdkDelta(before, await scrapeSdk(env.sdkMetricsUrl)),
    cpuSuspending: suspendingCpu,
    cpuAnswering: answeringCpu,
    leftovers: await leftovers(env),
    failures,
    errors: errors.slice(0, 5),
  };
  log(
    `waiting: answered all in ${result.answerAllMs} ms, all ended in ${result.completeAllMs} ms (${completed} completed, ${failed} failed)`,
  );
  return result;
}
