import * as path from 'node:path';
import { probeWorkflowThreads, workerMemory } from './memory';

// What a smaller workflow cache costs when a waiting Run is answered:
// `node dist/bench/replay-cost.js <runs> <execs before the ask> [KEY=VALUE...]` starts the bench's world
// with those worker settings (e.g. STASIS_MAX_CACHED_WORKFLOWS=2), suspends <runs> Runs that each ran
// <execs> sandbox commands before asking, then answers them one at a time and prints how long each
// answer took (the `respond` Update, accepted and completed: a Run evicted from the cache replays
// its history first), with the Runs' history length. Run once per setting and compare.
// An experiment, not a figure.

probeWorkflowThreads();

async function main(): Promise<void> {
  const n = Number(process.argv[2] ?? '50');
  const execs = Number(process.argv[3] ?? '0');
  const settings = Object.fromEntries(
    process.argv
      .slice(4)
      .filter((a) => a.includes('='))
      .map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]),
  );
  const { startEnv } = await import('./env');
  const { settle, waitReleased } = await import('./fleet');
  const { newRunId } = await import('./specs');
  const { mapLimit, summarize } = await import('./stats');
  const log = (line: string) => process.stderr.write(`[replay-cost] ${line}\n`);
  const env = await startEnv(log, settings);
  try {
    const tag = `rc${Date.now().toString(36)}`;
    const ids = Array.from({ length: n }, () => newRunId(tag));
    const spec = (runId: string) => ({
      runId,
      agent: {
        driver: 'scripted' as const,
        steps: [
          ...Array.from({ length: execs }, (_, i) => ({ exec: `echo ${i} >> log.txt` })),
          { ask: 'Approve?' },
          { exec: 'echo approved > approved.txt' },
          { complete: 'done' },
        ],
      },
      sandbox: {
        provider: 'local' as const,
        workspace: { kind: 'active' as const, hostPath: path.join(env.scratch, 'rc', runId) },
      },
    });
    await mapLimit(ids, 10, (id) => env.client.runs.start(spec(id)));
    const released = await waitReleased(env, new Set(ids), Date.now() + 600_000, 1000);
    const history = await env.temporal.workflow.getHandle(ids[0]).fetchHistory();
    const memory = await workerMemory();
    log(`${released}/${n} waiting, ${env.worker.cachedWorkflows()} cached, history ${history.events?.length} events`);
    // One at a time: each answer's time is its own, not a queue's.
    const ms: number[] = [];
    const failures: string[] = [];
    for (const id of ids) {
      const t = performance.now();
      try {
        await env.client.runs.respond(id, 'int-1', { decision: 'approve' });
        ms.push(performance.now() - t);
      } catch (err) {
        // Counted and described, not thrown: the other answers still measure.
        const chain: string[] = [];
        for (let e: unknown = err; e instanceof Error && chain.length < 5; e = e.cause) chain.push(e.message);
        failures.push(`${id}: ${chain.join(' <- ')}`);
      }
    }
    log(`answers: ${JSON.stringify(summarize(ms))}, ${failures.length} failed ${JSON.stringify(failures.slice(0, 2))}`);
    const settled = await settle(env, new Set(ids), Date.now() + 600_000, 1000);
    process.stdout.write(
      `${JSON.stringify({
        settings,
        runs: n,
        execsBeforeAsk: execs,
        historyEvents: history.events?.length,
        cachedWhileWaiting: memory,
        respondMs: summarize(ms),
        respondFailures: failures.slice(0, 5),
        respondFailed: failures.length,
        completed: settled.completed,
        failed: settled.failed,
      })}\n`,
    );
  } finally {
    await env.stop();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`replay-cost failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
