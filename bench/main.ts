import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BINARIES } from '../platform/binaries';
import { isAlive } from '../platform/servers';
import { runCheckpointBench, type CheckpointWorkspace } from './checkpoint';
import { runCycleBench } from './cycle';
import { processesMentioning, startEnv, HOST_ID, type BenchEnv } from './env';
import { runHistoryCost } from './history-cost';
import { killSandboxProcesses, sandboxProcessCount } from './leftovers';
import { machineInfo } from './machine';
import { probeWorkflowThreads } from './memory';
import { renderMarkdown } from './report';
import type { BenchResults } from './results';
import { runThroughput } from './throughput';
import { runWaiting, type WaitingResult } from './waiting';

// `npm run bench [-- --quick]`: starts its own Temporal dev server and MinIO,
// one Stasis worker in this process and the typed client, measures the five
// figures of issue 6 each against a baseline in the same run, and writes
// bench/results.json and BENCHMARKS.md from what it measured. It never fails on
// a time; it fails only when it could not measure.

interface Plan {
  cycleReps: number;
  /** Size of the larger SNAPSHOT_AND_TERMINATE workspace of figure 1. */
  cycleLargeMiB: number;
  historyReps: number;
  historyCycles: number;
  checkpointWorkspaces: CheckpointWorkspace[];
  checkpointReps: number;
  /** The first always runs; the others only when the time left allows. */
  throughput: number[];
  /** Sizes of the scale-of-waiting phase: the first always runs, a larger one when the time left allows. */
  waitingRuns: number[];
  budgetMs: number;
}

const MIXED_64: CheckpointWorkspace = { name: '64 MiB mixed', kind: 'mixed', size: 64 };
const nodeModules = (files: number): CheckpointWorkspace => ({
  name: `node_modules-like, ${files.toLocaleString('en-US')} files`,
  kind: 'node_modules',
  size: files,
});

const PLANS: Record<'quick' | 'full' | 'waiting-scale', Plan> = {
  quick: {
    cycleReps: 2,
    cycleLargeMiB: 16,
    historyReps: 1,
    historyCycles: 2,
    checkpointWorkspaces: [MIXED_64, nodeModules(1000)],
    checkpointReps: 1,
    throughput: [10],
    waitingRuns: [1000],
    budgetMs: 3 * 60_000,
  },
  full: {
    cycleReps: 5,
    cycleLargeMiB: 64,
    historyReps: 2,
    historyCycles: 4,
    checkpointWorkspaces: [MIXED_64, { name: '512 MiB mixed', kind: 'mixed', size: 512 }, nodeModules(20_000)],
    checkpointReps: 2,
    throughput: [50, 200, 500],
    waitingRuns: [2000, 10_000],
    budgetMs: 20 * 60_000,
  },
  // `--waiting-scale`: figure 5 alone at the sizes the full run's budget cannot reach (10,000 Runs
  // take most of an hour on 2 cores); its figures go to bench/results-waiting.json and their own
  // part of BENCHMARKS.md.
  'waiting-scale': {
    cycleReps: 0,
    cycleLargeMiB: 0,
    historyReps: 0,
    historyCycles: 0,
    checkpointWorkspaces: [],
    checkpointReps: 0,
    throughput: [],
    waitingRuns: [2000, 10_000],
    budgetMs: 150 * 60_000,
  },
};

const ROOT = path.resolve(__dirname, '..', '..');

/** Every host id whose sandboxes the bench starts. */
const BENCH_HOSTS = [HOST_ID, 'bench-baseline', 'bench-ckpt-a', 'bench-ckpt-b'];

const secs = (ms: number): string => `${Math.round(ms / 1000)} s`;

/**
 * `--only=2,5` measures just those figures, for a quick look or a profile; such a
 * partial run writes its files to a temp directory, never over the published ones.
 */
const ONLY = /^--only=([1-5](,[1-5])*)$/;
const onlyArg = process.argv.find((a) => a.startsWith('--only'));
if (onlyArg && !ONLY.test(onlyArg)) {
  process.stderr.write(`bench: ${onlyArg}: expected --only=<figures>, e.g. --only=2,5 (figures 1 to 5)\n`);
  process.exit(2);
}
const only = onlyArg ? new Set(onlyArg.slice('--only='.length).split(',').map(Number)) : undefined;
const waitingScale = process.argv.some((a) => a === '--waiting-scale' || a.startsWith('--waiting-scale='));
if (waitingScale && (only || process.argv.includes('--quick'))) {
  process.stderr.write('bench: --waiting-scale runs figure 5 alone; it takes neither --only nor --quick\n');
  process.exit(2);
}
const wanted = (figure: number) => (waitingScale ? figure === 5 : !only || only.has(figure));
const OUT_DIR = only ? mkdtempSync(path.join(os.tmpdir(), 'stasis-bench-only-')) : undefined;
/** `--waiting-scale=2000` (sizes, comma-separated): the long run at other sizes than 2,000 and 10,000. */
const scaleArg = process.argv.find((a) => a.startsWith('--waiting-scale='));
if (scaleArg && !/^--waiting-scale=\d+(,\d+)*$/.test(scaleArg)) {
  process.stderr.write(`bench: ${scaleArg}: expected --waiting-scale=<Runs>[,<Runs>...], e.g. --waiting-scale=2000\n`);
  process.exit(2);
}
const waitingRunsArg = scaleArg?.slice('--waiting-scale='.length).split(',').map(Number);
const RESULTS = path.join(ROOT, 'bench', 'results.json');
const WAITING_RESULTS = path.join(ROOT, 'bench', 'results-waiting.json');

function readResults(file: string): BenchResults | undefined {
  return existsSync(file) ? (JSON.parse(readFileSync(file, 'utf8')) as BenchResults) : undefined;
}

function commitMeasured(): string | undefined {
  try {
    return execFileSync('git', ['rev-parse', 'HEAD'], {
      cwd: ROOT,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return undefined;
  }
}

/** Writes both files from what has been measured so far (after every phase, so an interrupted run still leaves its figures). */
function save(results: BenchResults, started: number): void {
  results.durationMs = Date.now() - started;
  results.loadAtEnd = os.loadavg().map((l) => Math.round(l * 100) / 100);
  if (waitingScale) {
    // The long waiting run has its own file; BENCHMARKS.md shows it beside the last full or quick run.
    writeFileSync(WAITING_RESULTS, `${JSON.stringify(results, null, 2)}\n`);
    const main = readResults(RESULTS);
    if (main) writeFileSync(path.join(ROOT, 'BENCHMARKS.md'), renderMarkdown(main, results));
    return;
  }
  writeFileSync(OUT_DIR ? path.join(OUT_DIR, 'results.json') : RESULTS, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(
    path.join(OUT_DIR ?? ROOT, 'BENCHMARKS.md'),
    renderMarkdown(results, OUT_DIR ? undefined : readResults(WAITING_RESULTS)),
  );
}

function log(line: string): void {
  const t = new Date().toISOString().slice(11, 19);
  process.stderr.write(`[bench ${t}] ${line}\n`);
}

async function phase<T>(name: string, results: BenchResults, fn: () => Promise<T>): Promise<T | undefined> {
  const started = Date.now();
  try {
    const value = await fn();
    log(`${name} done in ${Math.round((Date.now() - started) / 1000)} s`);
    return value;
  } catch (err) {
    results.phaseErrors[name] = err instanceof Error ? (err.stack ?? err.message) : String(err);
    log(`${name} FAILED: ${String(err)}`);
    return undefined;
  }
}

async function main(): Promise<void> {
  if (process.argv.includes('--render-only')) {
    // Re-renders BENCHMARKS.md from the figures of the last run (after a change to the report's prose).
    const results = JSON.parse(readFileSync(RESULTS, 'utf8')) as BenchResults;
    writeFileSync(path.join(ROOT, 'BENCHMARKS.md'), renderMarkdown(results, readResults(WAITING_RESULTS)));
    return;
  }
  const quick = process.argv.includes('--quick');
  const mode = waitingScale ? 'waiting-scale' : quick ? 'quick' : 'full';
  const plan = { ...PLANS[mode], waitingRuns: waitingRunsArg ?? PLANS[mode].waitingRuns };
  const started = Date.now();
  const results: BenchResults = {
    command: `npm run bench${quick || only || waitingScale ? ` -- ${[quick ? '--quick' : '', waitingScale ? (scaleArg ?? '--waiting-scale') : '', onlyArg ?? ''].filter(Boolean).join(' ')}` : ''}`,
    mode,
    commit: commitMeasured(),
    date: new Date().toISOString(),
    machine: machineInfo(),
    servers: { temporalCli: BINARIES.temporal.version, minio: BINARIES.minio.version },
    durationMs: 0,
    cycle: [],
    history: [],
    checkpoint: [],
    throughput: [],
    notMeasured: [],
    phaseErrors: {},
    processesLeftBehind: 0,
    loadAtEnd: [],
  };
  log(`${mode} mode on ${results.machine.cpuModel}, ${results.machine.cores} cores, ${results.machine.ramGiB} GiB`);
  let env: BenchEnv | undefined;
  const stop = async () => {
    await env?.stop();
  };
  process.once('SIGINT', () => {
    results.phaseErrors.interrupted = 'SIGINT: the run was interrupted; figures after this point are missing';
    save(results, started);
    // Sandboxes of Runs still in flight die with the run, as at a normal end.
    void stop()
      .then(() => killSandboxProcesses(BENCH_HOSTS))
      .then(() => process.exit(130));
  });
  try {
    // Sandboxes an interrupted earlier run left would count as this run's leftovers.
    const stale = await killSandboxProcesses(BENCH_HOSTS);
    if (stale > 0) log(`killed ${stale} sandbox processes an earlier, interrupted run left`);
    // Before the worker exists: its workflow threads then report their V8 heaps (figure 5).
    probeWorkflowThreads();
    env = await startEnv(log);
    const e = env;
    const left = () => plan.budgetMs - (Date.now() - started);
    if (wanted(1))
      results.cycle =
        (await phase('1 cycle latency', results, () => runCycleBench(e, plan.cycleReps, plan.cycleLargeMiB, log))) ??
        [];
    save(results, started);
    if (wanted(3))
      results.history =
        (await phase('3 history cost', results, () => runHistoryCost(e, plan.historyReps, plan.historyCycles, log))) ??
        [];
    save(results, started);
    if (wanted(4)) {
      const ck = await phase('4 checkpoint speed', results, () =>
        runCheckpointBench(e, plan.checkpointWorkspaces, plan.checkpointReps, log),
      );
      results.checkpoint = ck?.results ?? [];
      if (ck && !ck.restic)
        results.notMeasured.push('restic columns of figure 4: the `restic` command is not installed.');
    }
    save(results, started);
    const first = !wanted(2)
      ? undefined
      : await phase(`2 throughput ${plan.throughput[0]}`, results, async () => {
          // The first size runs under the CPU profiler (its Stasis part): what dominates under load, measured.
          return runThroughput(e, plan.throughput[0], Math.max(60_000, left() / 3), log, { profile: true });
        });
    if (first) results.throughput.push(first);
    save(results, started);
    // The same at the first size with DETACH: the orchestration alone (no snapshot, volume or restore),
    // against the same bare baseline, so the sandbox work's share of the ratio is seen.
    const detached = !wanted(2)
      ? undefined
      : await phase(`2 throughput ${plan.throughput[0]} DETACH`, results, () =>
          runThroughput(e, plan.throughput[0], Math.max(60_000, left() / 4), log, { mode: 'DETACH' }),
        );
    if (detached) results.throughput.push(detached);
    save(results, started);
    // Waiting: start Runs until all planned are, or until those started could no longer be answered
    // and completed in the time left at the rate seen (bench/waiting.ts), then answer them all.
    const rampMs = Math.max(20_000, left() - 30_000);
    if (wanted(5))
      results.waiting = await phase('5 scale of waiting', results, () =>
        runWaiting(e, plan.waitingRuns[0], rampMs, Math.max(60_000, left() - 20_000), log),
      );
    const short = (w: WaitingResult | undefined, ramp: number) => {
      if (w && w.runs < w.target)
        results.notMeasured.push(
          `Scale of waiting with ${w.target} Runs: ${w.runs} were waiting together within the ${secs(ramp)} ramp this budget allowed ` +
            `(${secs(w.suspendAllMs)} for them)${w.shortBecause ? `: ${w.shortBecause}` : ''}; the figures are for ${w.runs}.`,
        );
    };
    short(results.waiting, rampMs);
    save(results, started);
    for (const n of wanted(2) ? plan.throughput.slice(1) : []) {
      const last = results.throughput.filter((t) => t.mode !== 'DETACH').at(-1);
      const remaining = left() - 30_000;
      const estimate = last && last.cyclesPerSecond > 0 ? (n / last.cyclesPerSecond) * 1.3 * 1000 : Infinity;
      if (estimate > remaining) {
        results.notMeasured.push(
          `Throughput with ${n} concurrent Runs: estimated ${secs(estimate)} at the ${last?.concurrency ?? '?'}-Run rate, ` +
            `${secs(Math.max(0, remaining))} left of the ${plan.budgetMs / 60_000}-minute budget.`,
        );
        log(`skipping throughput ${n}: estimated ${secs(estimate)}, ${secs(Math.max(0, remaining))} left`);
        continue;
      }
      const r = await phase(`2 throughput ${n}`, results, () => runThroughput(e, n, Math.max(60_000, remaining), log));
      if (r) results.throughput.push(r);
      save(results, started);
    }
    for (const n of wanted(5) && results.waiting ? plan.waitingRuns.slice(1) : []) {
      const last = results.waiting!;
      // Suspending, answering and completing scale with the Runs: estimated from the first size.
      const estimate = ((last.suspendAllMs + last.completeAllMs) * n) / Math.max(1, last.runs) + 30_000;
      const remaining = left() - 30_000;
      if (estimate > remaining) {
        results.notMeasured.push(
          `Scale of waiting with ${n} Runs: estimated ${secs(estimate)} at the ${last.runs}-Run rate, ${secs(Math.max(0, remaining))} left of the ${plan.budgetMs / 60_000}-minute budget.`,
        );
        continue;
      }
      const ramp = remaining * 0.45;
      const w = await phase(`5 scale of waiting ${n}`, results, () => runWaiting(e, n, ramp, remaining, log));
      if (w) (results.waitingMore ??= []).push(w);
      short(w, ramp);
      save(results, started);
    }
    if (quick) {
      results.notMeasured.push(
        `Quick mode: fewer repetitions, ${plan.cycleLargeMiB} MiB instead of 64 MiB in figure 1, checkpoints of ${plan.checkpointWorkspaces.map((w) => w.name).join(' and ')} instead of 64/512 MiB mixed and 20,000 small files, ` +
          `${plan.throughput.join('/')} concurrent Runs instead of 50/200/500, ${plan.waitingRuns.join('/')} waiting Runs instead of 2,000/10,000.`,
      );
    }
  } finally {
    await stop();
    const pids = [env?.temporalServer.pid].filter((p): p is number => p !== undefined);
    let left = pids.filter((pid) => isAlive(pid)).length;
    if (env) left += processesMentioning(env.dataDir).filter((pid) => !pids.includes(pid)).length;
    const hosts = BENCH_HOSTS;
    for (const host of hosts) left += await sandboxProcessCount(host);
    results.processesLeftBehind = left;
    // Sandboxes of Runs that had not ended when the worker stopped: counted above, not left running.
    const killed = await killSandboxProcesses(hosts);
    if (killed > 0) log(`killed ${killed} sandbox processes of unfinished Runs`);
    save(results, started);
    log(
      `wrote ${OUT_DIR ? `${OUT_DIR}/` : 'bench/'}results.json and BENCHMARKS.md in ${Math.round(results.durationMs / 1000)} s; processes left behind: ${left}`,
    );
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    process.exit(1);
  },
);
