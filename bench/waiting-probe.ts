import { readFileSync } from 'node:fs';
import * as v8 from 'node:v8';
import { perRun, probeWorkflowThreads, snapshotWorkflowThreads, workerMemory } from './memory';

// Where a waiting Run's memory goes: `node dist/bench/waiting-probe.js <runs> [KEY=VALUE...]`
// starts the bench's world with those worker settings (STASIS_* variables), suspends <runs> Runs, and
// prints the process's memory by part (RSS, main V8 heap, each workflow thread's V8 heap, what is
// outside V8) with 0 Runs, with all waiting, and after all completed. An experiment, not a figure.
// `--snapshots=<dir>` also writes a heap snapshot of the workflow threads at each step, for
// `node dist/bench/heap-diff.js <a> <b> <runs between>` (what one more cached Run holds, by constructor).
// `--main-snapshots=<dir>` writes one of the main thread (activities, providers, client) at each step.

// Before the SDK is loaded (./env imports it below): its workflow threads then report their V8 heaps.
probeWorkflowThreads();

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

async function main(): Promise<void> {
  const n = Number(process.argv[2] ?? '300');
  const settings = Object.fromEntries(
    process.argv
      .slice(3)
      .filter((a) => a.includes('=') && !a.startsWith('--'))
      .map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]),
  );
  // Imported after the patch: the SDK creates its workflow threads through the patched class.
  const { startEnv } = await import('./env');
  const { respondAll, settle, waitAllReleased } = await import('./fleet');
  const { newRunId } = await import('./specs');
  const { mapLimit } = await import('./stats');
  const path = await import('node:path');
  const log = (line: string) => process.stderr.write(`[probe] ${line}\n`);
  const env = await startEnv(log, settings);
  const snapshots = process.argv.find((a) => a.startsWith('--snapshots='))?.slice('--snapshots='.length);
  const mainSnapshots = process.argv.find((a) => a.startsWith('--main-snapshots='))?.slice('--main-snapshots='.length);
  const measure = async (label: string, runs: number) => {
    // A snapshot holds only what is reachable: no GC needed first.
    if (mainSnapshots) {
      log(
        `main snapshot: ${v8.writeHeapSnapshot(path.join(mainSnapshots, `${label.replace(/\W+/g, '-')}.heapsnapshot`))}`,
      );
    }
    if (snapshots)
      log(`snapshots: ${(await snapshotWorkflowThreads(path.join(snapshots, label.replace(/\W+/g, '-')))).join(' ')}`);
    const row = {
      label,
      runs,
      cached: env.worker.cachedWorkflows(),
      ...(await workerMemory()),
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
        perRun: perRun(base, waiting, n),
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
