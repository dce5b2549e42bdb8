import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { round, summarize } from './stats';

// Issue 17, the process-start part of a cycle alone: the CPU a sandbox's start -> exec -> stop costs
// the worker's process (main thread and its I/O threads) and the process starter with the sandbox
// processes, with no Temporal, no object store and no volume. With BASELINE_DIST=<a dist/ of
// another commit> that commit's provider runs too, its reps alternating with this build's, in this
// one process (each build has its own process starter): an A/B under the same load.
// Run with `node dist/bench/throughput-starts.js [cycles per rep] [reps]`.

interface Build {
  name: string;
  provider: import('../providers/api').SandboxProvider;
  spawnerPid: () => number | undefined;
  hostId: string;
  dataDir: string;
}

function load(name: string, dist: string): Build {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const req = (rel: string) => require(path.join(dist, rel)) as Record<string, unknown>;
  const { createLocalProvider } = req('providers/local') as typeof import('../providers/local');
  const { FsCheckpointStore } = req('stores/fs') as typeof import('../stores/fs');
  const { spawnerPid } = req('providers/spawner') as typeof import('../providers/spawner');
  const dataDir = mkdtempSync(path.join(os.tmpdir(), `stasis-starts-${name}-`));
  const hostId = `tput-starts-${name}-${process.pid}`;
  const store = new FsCheckpointStore(path.join(dataDir, 'store'));
  return { name, provider: createLocalProvider({ hostId, dataDir, store }), spawnerPid, hostId, dataDir };
}

/** CPU seconds of a /proc stat file, its waited-for children's included. */
function withChildren(pid: number | undefined): number {
  if (pid === undefined) return 0;
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / 100;
}

const ctx = (build: Build) => ({ ownerId: 'bench', hostId: build.hostId });

/** `cycles` sandboxes, each provisioned once, then started, exec'd once and stopped: CPU ms per cycle. */
async function rep(build: Build, cycles: number, repIndex: number): Promise<{ workerMs: number; startsMs: number }> {
  const ids = Array.from({ length: cycles }, (_, i) => `s${repIndex}-${i}`);
  try {
    for (const sandboxId of ids) await build.provider.provision({ sandboxId, fence: 1 }, ctx(build));
    const cpu0 = process.cpuUsage();
    const starter0 = withChildren(build.spawnerPid());
    for (const sandboxId of ids) {
      await build.provider.start({ sandboxId, fence: 1 }, ctx(build));
      const out = await build.provider.exec({ sandboxId, fence: 1, jobId: 'j', command: 'true' }, ctx(build));
      if (out.exitCode !== 0) throw new Error(`${build.name}: exec exited ${out.exitCode}: ${out.stderr}`);
      await build.provider.stop({ sandboxId, fence: 1 }, ctx(build));
    }
    const cpu = process.cpuUsage(cpu0);
    const startsMs = (withChildren(build.spawnerPid()) - starter0) * 1000;
    return { workerMs: (cpu.user + cpu.system) / 1000 / cycles, startsMs: startsMs / cycles };
  } finally {
    // Their processes and groups go too, also after a failure.
    for (const sandboxId of ids)
      await build.provider.destroy({ sandboxId, fence: 1 }, ctx(build)).catch(() => undefined);
  }
}

async function main(): Promise<void> {
  const [cycles = 100, reps = 7] = process.argv.slice(2).map(Number);
  const builds = [load('new', path.resolve(__dirname, '..'))];
  if (process.env.BASELINE_DIST) builds.unshift(load('old', path.resolve(process.env.BASELINE_DIST)));
  const results = new Map(builds.map((b) => [b.name, { worker: [] as number[], starts: [] as number[] }]));
  console.log(`load ${readFileSync('/proc/loadavg', 'utf8').trim()}`);
  // The process starter and its channel keep nothing alive (a worker's connection does): this does.
  const alive = setInterval(() => undefined, 1_000);
  try {
    await rep(builds[0], 5, -1); // warm-up: the starter, the cgroup probe, the JIT
    if (builds[1]) await rep(builds[1], 5, -1);
    for (let i = 0; i < reps; i++) {
      for (const build of i % 2 === 0 ? builds : [...builds].reverse()) {
        const r = await rep(build, cycles, i);
        results.get(build.name)!.worker.push(r.workerMs);
        results.get(build.name)!.starts.push(r.startsMs);
        console.log(
          `rep ${i} ${build.name}: worker ${round(r.workerMs, 2)} ms/cycle, starter+sandbox ${round(r.startsMs, 2)} ms/cycle`,
        );
      }
    }
  } finally {
    clearInterval(alive);
    for (const b of builds) rmSync(b.dataDir, { recursive: true, force: true });
  }
  for (const [name, r] of results) {
    console.log(
      `RESULT ${name}: worker process median ${summarize(r.worker).median} ms/cycle, starter+sandbox processes median ${summarize(r.starts).median} ms/cycle (${reps} reps of ${cycles})`,
    );
  }
  console.log(`load ${readFileSync('/proc/loadavg', 'utf8').trim()}`);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
