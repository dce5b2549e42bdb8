import * as v8 from 'node:v8';
import workerThreadsModule from 'node:worker_threads';
import * as workerThreads from 'node:worker_threads';
import { readFileSync } from 'node:fs';

// Where a waiting Run's memory goes: `node --expose-gc dist/bench/waiting-probe.js <runs> [KEY=VALUE...]`
// starts the bench's world with those worker settings (STASIS_* variables), suspends <runs> Runs, and
// prints the process's memory by part (RSS, main V8 heap, each workflow thread's V8 heap, what is
// outside V8) with 0 Runs, with all waiting, and after all completed. An experiment, not a figure.

/** The SDK's workflow threads, each with a port that answers with its V8 heap statistics. */
const probes: workerThreads.MessagePort[] = [];
const OriginalWorker = workerThreads.Worker;
const PROBE = `
const { workerData } = require('node:worker_threads');
const v8 = require('node:v8');
const port = workerData.__probePort;
port.on('message', () => {
  if (globalThis.gc) globalThis.gc();
  port.postMessage(v8.getHeapStatistics());
});
port.unref();
require(workerData.__probeFile);
`;
class ProbedWorker extends OriginalWorker {
  constructor(file: string | URL, options: workerThreads.WorkerOptions = {}) {
    const { port1, port2 } = new workerThreads.MessageChannel();
    super(PROBE, {
      ...options,
      eval: true,
      workerData: { __probeFile: String(file), __probePort: port2 },
      transferList: [port2],
    });
    port1.unref();
    probes.push(port1);
  }
}
// The module object itself (a default import; an `import * as` binding may be a copy): the SDK reads `Worker` from it.
(workerThreadsModule as { Worker: typeof workerThreads.Worker }).Worker = ProbedWorker;

function threadHeap(port: workerThreads.MessagePort): Promise<v8.HeapInfo> {
  return new Promise((resolve) => {
    port.once('message', (stats: v8.HeapInfo) => resolve(stats));
    port.postMessage('stats');
  });
}

function status(field: string): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync('/proc/self/status', 'utf8'));
  return match ? Number(match[1]) / 1024 : 0;
}

/** Resident MiB by kind of mapping (/proc/self/smaps): brk heap, anonymous mappings, files, stacks. */
function residentByKind(): Record<string, number> {
  const kinds: Record<string, number> = {};
  let kind = 'anon';
  for (const line of readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
    const header = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (header) {
      const name = header[1];
      kind = name === '' ? 'anon' : name.startsWith('[') ? name.replace(/:.*/, '') : 'file';
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss) kinds[kind] = (kinds[kind] ?? 0) + Number(rss[1]) / 1024;
  }
  return Object.fromEntries(Object.entries(kinds).map(([k, v]) => [k, Math.round(v)]));
}

const mib = (bytes: number) => Math.round((bytes / (1024 * 1024)) * 10) / 10;

async function main(): Promise<void> {
  const n = Number(process.argv[2] ?? '300');
  const settings = Object.fromEntries(
    process.argv.slice(3).map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]),
  );
  // Imported after the patch: the SDK creates its workflow threads through the patched class.
  const { startEnv } = await import('./env');
  const { respondAll, settle, waitAllReleased } = await import('./fleet');
  const { newRunId } = await import('./specs');
  const { mapLimit } = await import('./stats');
  const path = await import('node:path');
  const log = (line: string) => process.stderr.write(`[probe] ${line}\n`);
  const env = await startEnv(log, settings);
  const measure = async (label: string, runs: number) => {
    (globalThis as { gc?: () => void }).gc?.();
    const threads = await Promise.all(probes.map(threadHeap));
    const main = v8.getHeapStatistics();
    const usage = process.memoryUsage();
    const threadUsed = threads.reduce((s, t) => s + t.used_heap_size, 0);
    const threadTotal = threads.reduce((s, t) => s + t.total_heap_size, 0);
    const rss = status('VmRSS');
    const row = {
      label,
      runs,
      cached: env.worker.cachedWorkflows(),
      rssMiB: Math.round(rss),
      mainHeapUsedMiB: mib(main.used_heap_size),
      mainHeapTotalMiB: mib(main.total_heap_size),
      externalMiB: mib(usage.external),
      arrayBuffersMiB: mib(usage.arrayBuffers),
      threads: threads.length,
      threadHeapUsedMiB: mib(threadUsed),
      threadHeapTotalMiB: mib(threadTotal),
      /** RSS not in any V8 heap: Rust core, malloc, code, stacks. */
      outsideV8MiB: Math.round(rss - (main.total_heap_size + threadTotal) / (1024 * 1024)),
      residentByKind: residentByKind(),
    };
    process.stdout.write(`${JSON.stringify(row)}\n`);
    return row;
  };
  try {
    await new Promise((r) => setTimeout(r, 3000));
    const base = await measure('0 Runs', 0);
    const ids = Array.from({ length: n }, () => newRunId('probe'));
    const spec = (runId: string) => ({
      runId,
      agent: {
        driver: 'scripted' as const,
        steps: [{ ask: 'Approve?' }, { exec: 'echo approved > approved.txt' }, { complete: 'done' }],
      },
      sandbox: {
        provider: 'local' as const,
        workspace: { kind: 'active' as const, hostPath: path.join(env.scratch, 'probe', runId) },
      },
    });
    const t0 = Date.now();
    for (let i = 0; i < ids.length; i += 100) {
      const batch = ids.slice(i, i + 100);
      await mapLimit(batch, 20, (id) => env.client.runs.start(spec(id)));
      await waitAllReleased(env, new Set(batch), Date.now() + 600_000, 500);
      // The slope between steps is what one more waiting Run costs, without what the first ones warmed up.
      if (i + 100 < ids.length) await measure(`${i + 100} waiting`, i + 100);
    }
    log(`${n} suspended in ${Date.now() - t0} ms`);
    await new Promise((r) => setTimeout(r, 3000));
    const waiting = await measure('all waiting', n);
    process.stdout.write(
      `${JSON.stringify({
        perRun: {
          rssMiB: (waiting.rssMiB - base.rssMiB) / n,
          threadHeapUsedMiB: (waiting.threadHeapUsedMiB - base.threadHeapUsedMiB) / n,
          threadHeapTotalMiB: (waiting.threadHeapTotalMiB - base.threadHeapTotalMiB) / n,
          mainHeapTotalMiB: (waiting.mainHeapTotalMiB - base.mainHeapTotalMiB) / n,
          outsideV8MiB: (waiting.outsideV8MiB - base.outsideV8MiB) / n,
        },
      })}\n`,
    );
    if (!process.argv.includes('--no-answer')) {
      const deadline = Date.now() + 600_000;
      await respondAll(env, ids, 50, deadline);
      const settled = await settle(env, new Set(ids), deadline, 500);
      log(`${settled.completed} completed, ${settled.failed} failed`);
      await new Promise((r) => setTimeout(r, 3000));
      await measure('all completed', n);
    }
  } finally {
    await env.stop();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`probe failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
