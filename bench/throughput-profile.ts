import { runCycleBench } from './cycle';
import { startEnv, type BenchEnv } from './env';
import { timedHistory } from './history';
import { loadDist as load } from './script';
import { runThroughput } from './throughput';

// Issue 17, measured apart from `npm run bench` (which kills the sandbox processes of the bench's
// host ids machine-wide): one worker on a host id of its own runs figure 2 (N concurrent Runs, then
// bare Temporal at N right after, same server) and figure 1's DETACH cycle (Run vs direct provider
// calls, alternating). With STAGES=1 the sandbox operations that mount, unmount and start processes
// count how many are in flight at once (sampled every 50 ms), to see what serialises under load.
// With S3_CALLS=1 the worker's S3 requests are counted by command (the bare run makes none). With
// THROUGHPUT_MODE=DETACH the Runs release by DETACH (no snapshot, no volume work): orchestration alone.
// Run with `node dist/bench/throughput-profile.js [concurrency ...] [--detach reps] [--profile]`.

const s3Calls = new Map<string, number>();

/** Counts every S3 request the process sends, by command name. */
function countS3(): void {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { S3Client } = require('@aws-sdk/client-s3') as typeof import('@aws-sdk/client-s3');
  const send = S3Client.prototype.send as (...args: unknown[]) => unknown;
  S3Client.prototype.send = function (this: unknown, ...args: unknown[]) {
    const name = (args[0] as object).constructor.name;
    s3Calls.set(name, (s3Calls.get(name) ?? 0) + 1);
    return send.apply(this, args);
  } as typeof S3Client.prototype.send;
}

const inFlight = new Map<string, number>();
const peak = new Map<string, number>();
const samples = new Map<string, number[]>();

function wrap(label: string, mod: Record<string, unknown>, names: string[]): void {
  for (const name of names) {
    const original = mod[name] as (...args: unknown[]) => unknown;
    if (typeof original !== 'function') throw new Error(`${label}.${name} is not a function`);
    const key = `${label}.${name}`;
    mod[name] = (...args: unknown[]) => {
      inFlight.set(key, (inFlight.get(key) ?? 0) + 1);
      peak.set(key, Math.max(peak.get(key) ?? 0, inFlight.get(key) ?? 0));
      const done = () => inFlight.set(key, (inFlight.get(key) ?? 1) - 1);
      const result = original(...args);
      if (result instanceof Promise) return result.finally(done);
      done();
      return result;
    };
  }
}

/** `count` Runs' timelines (ms from their start): where one Run waited. */
async function timelines(env: BenchEnv, prefix: string, count: number, log: (line: string) => void): Promise<void> {
  let shown = 0;
  for await (const wf of env.temporal.workflow.list({ query: `WorkflowId STARTS_WITH '${prefix}'` })) {
    if (shown++ >= count) break;
    const events = await timedHistory(env.temporal, wf.workflowId);
    const t0 = events[0]?.timeMs ?? 0;
    log(`timeline ${wf.workflowId}`);
    for (const e of events)
      console.log(`  +${(e.timeMs - t0).toFixed(0).padStart(6)} ${e.id} ${e.type} ${e.activity ?? ''}`);
  }
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const detachAt = args.indexOf('--detach');
  const detachReps = detachAt >= 0 ? Number(args[detachAt + 1]) : 0;
  const profile = args.includes('--profile');
  const sizes = args.filter((a, i) => /^[0-9]+$/.test(a) && (detachAt < 0 || i !== detachAt + 1)).map(Number);
  if (process.env.STAGES === '1') {
    wrap('spawner', load('providers/spawner'), ['startProcess']);
    wrap('volume', load('providers/volume'), ['prepareVolume', 'mountVolume', 'unmountVolume', 'releaseVolume']);
  }
  if (process.env.S3_CALLS === '1') countS3();
  const log = (line: string) => console.log(`[${new Date().toISOString()}] ${line}`);
  const env = await startEnv(log, { STASIS_HOST_ID: 'tput-host' });
  const sampler = setInterval(() => {
    for (const [k, v] of inFlight) samples.set(k, [...(samples.get(k) ?? []), v]);
  }, 50);
  try {
    log(`load ${(await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').trim()}`);
    for (const n of sizes) {
      const mode = process.env.THROUGHPUT_MODE === 'DETACH' ? 'DETACH' : 'SNAPSHOT_AND_TERMINATE';
      const r = await runThroughput(env, n, 600_000, log, { profile, mode });
      log(
        `RESULT ${n}: stasis ${r.cyclesPerSecond} cycles/s (${r.wallMs} ms), bare ${r.bare?.cyclesPerSecond} (${r.bare?.wallMs} ms), ratio ${r.ratioToBare}; suspend ${r.suspendMs.median} ms, resume ${r.resumeMs.median} ms`,
      );
      log(`sdk ${JSON.stringify(r.sdk)}`);
      log(`cpu ${JSON.stringify(r.cpu)}`);
      if (r.bare) log(`bare cpu ${JSON.stringify(r.bare.cpu)}`);
      if (s3Calls.size > 0) log(`S3 requests so far ${JSON.stringify(Object.fromEntries(s3Calls))}`);
      if (r.profile) log(`profile ${JSON.stringify(r.profile).slice(0, 3000)}`);
      await timelines(env, `tp${n}-`, 2, log);
    }
    if (detachReps > 0) {
      const [d] = await runCycleBench(env, detachReps, 1, log, { modes: ['DETACH'], baselineHost: 'tput-baseline' });
      log(
        `RESULT DETACH: suspend ${d.suspendMs.median} ms vs direct ${d.baselineSuspendMs.median} (overhead ${d.suspendOverheadMs}); resume ${d.resumeMs.median} vs ${d.baselineResumeMs.median} (overhead ${d.resumeOverheadMs}); parts ${JSON.stringify(d.suspendParts)}`,
      );
    }
    if (detachReps > 0) await timelines(env, 'cyc-deta', 2, log);
    for (const [k, v] of samples) {
      const busy = v.filter((x) => x > 0);
      log(
        `in flight ${k}: peak ${peak.get(k)}, mean while busy ${(busy.reduce((a, b) => a + b, 0) / Math.max(1, busy.length)).toFixed(1)}, busy ${busy.length}/${v.length} samples`,
      );
    }
    log(`load ${(await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').trim()}`);
  } finally {
    clearInterval(sampler);
    await env.stop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
