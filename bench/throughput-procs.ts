import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import type { SandboxProvider } from '../providers/api';
import { SHELL_FROM_STDIN } from '../providers/command';
import { freePorts } from '../platform/ports';
import { startMinio } from '../platform/servers';
import { S3CheckpointStore } from '../stores/s3';
import { cpuSeconds } from './cpu';
import { loadDist as load } from './script';

// Issue 17: what the sandbox-side processes of one figure-2 cycle cost in CPU, by kind. One sandbox
// at a time goes through the Run's cycle on the provider directly (provision, exec, release with a
// snapshot, restore, exec, destroy). Every process is started by the process starter (spawner.ts),
// which reaps it: the starter's cutime+cstime (/proc/<pid>/stat) grow by exactly the CPU of each
// child it waited for (and of that child's own waited-for children), so the growth between a
// foreground process's start and its exit is that process's cost; background ones (inits) are reaped
// when the sandbox's processes are killed. The starter's own utime+stime is its work per start.
// Then each layer of an exec's start is measured alone (the starter, the shell joining the groups, prlimit or ulimit,
// bwrap's namespaces). Run with `node dist/bench/throughput-procs.js [cycles] [local|bwrap] [starts]`.

/** CPU of the process `pid` itself and of the children it reaped, in ms (bench/cpu.ts reads the stat file). */
function stat(pid: number): { self: number; children: number } {
  const file = `/proc/${pid}/stat`;
  const self = cpuSeconds(file);
  return { self: self * 1000, children: (cpuSeconds(file, true) - self) * 1000 };
}

interface Request {
  file: string;
  args: string[];
  background: boolean;
}

/** A process's kind, from what the starter was asked to run. */
function kindOf(r: Request): string {
  const all = [r.file, ...r.args];
  const inner = all.lastIndexOf('--') >= 0 ? all.slice(all.lastIndexOf('--') + 1) : all;
  const name = (p: string) => path.basename(p);
  if (all.includes('stasis-confine')) {
    const what = inner.includes('infinity') ? 'init (sleep infinity)' : 'exec (bash)';
    return `${what}${all.some((a) => name(a) === 'bwrap') ? ' in bwrap' : ''}`;
  }
  if (name(r.file) === 'mount' || name(r.file) === 'umount' || name(r.file) === 'sync') return name(r.file);
  return name(r.file).startsWith('mkfs') ? 'mkfs' : name(r.file);
}

const rows = new Map<string, { count: number; childMs: number; selfMs: number }>();
function add(kind: string, childMs: number, selfMs: number): void {
  const row = rows.get(kind) ?? { count: 0, childMs: 0, selfMs: 0 };
  row.count++;
  row.childMs += childMs;
  row.selfMs += selfMs;
  rows.set(kind, row);
}

async function main(): Promise<void> {
  const cycles = Number(process.argv[2] ?? 20);
  const kind = process.argv[3] ?? 'local';
  const starts = Number(process.argv[4] ?? 40);
  const spawner = load('providers/spawner');
  const startProcess = spawner.startProcess as (r: Request) => Promise<{ exited: Promise<unknown> }>;
  const spawnerPid = spawner.spawnerPid as () => number | undefined;
  const root = await fs.mkdtemp(path.join(os.tmpdir(), 'stasis-procs-'));
  const [port, consolePort] = await freePorts(2);
  const env = { ...process.env };
  for (const key of ['STASIS_S3_ENDPOINT', 'MINIO_ROOT_USER', 'MINIO_ROOT_PASSWORD']) delete env[key];
  const minio = await startMinio({ dataDir: path.join(root, 'minio-data'), port, consolePort, env });
  const store = new S3CheckpointStore({
    bucket: minio.bucket,
    region: minio.region,
    endpoint: minio.endpoint,
    credentials: { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' },
  });
  const hostId = `procs-${process.pid}`;
  const create = (
    kind === 'bwrap' ? load('providers/bwrap').createBwrapProvider : load('providers/local').createLocalProvider
  ) as (deps: unknown) => SandboxProvider;
  const provider = create({ hostId, dataDir: path.join(root, 'data'), store, volumes: 'auto' });
  // Every start goes through here: foreground ones are charged the starter's children-CPU growth until they exit.
  let started = 0;
  spawner.startProcess = async (r: Request) => {
    const pid = spawnerPid();
    const before = pid === undefined ? undefined : stat(pid);
    const result = await startProcess(r);
    started++;
    if (!r.background) {
      void result.exited.then(() => {
        const now = pid ?? spawnerPid();
        if (before === undefined || now === undefined) return;
        const after = stat(now);
        add(kindOf(r), after.children - before.children, after.self - before.self);
      });
    } else add(kindOf(r), 0, 0);
    return result;
  };
  const traceFile = process.env.PROCS_STRACE;
  let current: string | undefined; // a sandbox a failed cycle left: destroyed (its volume unmounted) at the end
  const cgroups = load('providers/cgroups') as {
    killGroup: (m: unknown, timeoutMs: number) => Promise<void>;
    hierarchies: () => { v2?: string; v1: { pids?: string; cpu?: string } };
  };
  const layersMarker = { sandboxId: 'layers', hostId };
  let tracer: ChildProcess | undefined;
  const context = (id: string) => ({ ownerId: id, hostId });
  const log = (line: string) => console.log(`[${new Date().toISOString()}] ${line}`);
  try {
    log(`load ${readFileSync('/proc/loadavg', 'utf8').trim()}; ${cycles} cycles on the ${kind} provider`);
    // One warm-up cycle (the starter's fork, the cgroup probe, first-use costs), not counted.
    const totals = { children: 0, self: 0, worker: 0, wall: 0, starts: 0 };
    for (let rep = -1; rep < cycles; rep++) {
      const id = `c${rep + 1}`;
      current = id;
      const pid = spawnerPid();
      const before = pid === undefined ? undefined : stat(pid);
      const worker = process.cpuUsage();
      const wall = performance.now();
      const startsBefore = started;
      await provider.provision({ sandboxId: id, fence: 1 }, context(id));
      await provider.start({ sandboxId: id, fence: 1 }, context(id));
      await provider.exec(
        { sandboxId: id, fence: 1, jobId: 'fill', command: 'head -c 4096 /dev/zero > data.bin' },
        context(id),
      );
      const receipt = await provider.release(
        { sandboxId: id, fence: 2, idempotencyKey: `${id}-r`, mode: 'SNAPSHOT_AND_TERMINATE', reason: 'ask' },
        context(id),
      );
      await provider.restore({ sandboxId: id, fence: 3, checkpoint: receipt.checkpoint! }, context(id));
      await provider.exec(
        { sandboxId: id, fence: 3, jobId: 'echo', command: 'echo cycle 1 >> cycles.txt' },
        context(id),
      );
      await provider.destroy({ sandboxId: id, fence: 4 }, context(id));
      current = undefined;
      await new Promise((r) => setTimeout(r, 250)); // pipes' grace, kills reaped
      if (rep < 0) {
        rows.clear();
        if (traceFile) {
          // Every fork and exec below the starter (ours only: attached by its pid), to count images per cycle.
          tracer = spawn(
            'strace',
            ['-f', '-qq', '-o', traceFile, '-e', 'trace=execve,clone,clone3,vfork,fork', '-p', String(spawnerPid())],
            { stdio: 'ignore' },
          );
          await new Promise((r) => setTimeout(r, 1000));
        }
        continue;
      }
      const after = stat(spawnerPid()!);
      const used = process.cpuUsage(worker);
      totals.children += after.children - (before?.children ?? 0);
      totals.self += after.self - (before?.self ?? 0);
      totals.worker += (used.user + used.system) / 1000;
      totals.wall += performance.now() - wall - 250;
      totals.starts += started - startsBefore;
    }
    if (tracer) {
      tracer.kill('SIGINT');
      await new Promise((r) => tracer!.once('exit', r));
      const lines = readFileSync(traceFile!, 'utf8').split('\n');
      const execs = new Map<string, number>();
      for (const line of lines) {
        const m = /execve\("([^"]+)".*= 0$/.exec(line);
        if (m) execs.set(path.basename(m[1]), (execs.get(path.basename(m[1])) ?? 0) + 1);
      }
      const forks = lines.filter(
        (l) => /(clone3?|v?fork)\(/.test(l) && !l.includes('CLONE_THREAD') && / = [0-9]+$/.test(l),
      ).length;
      log(
        `traced per cycle: ${(forks / cycles).toFixed(1)} forks; images exec'd ${JSON.stringify(Object.fromEntries([...execs].map(([k, v]) => [k, v / cycles])))}`,
      );
    }
    const per = (x: number) => (x / cycles).toFixed(1);
    const foreground = [...rows.values()].reduce((a, r) => a + r.childMs, 0);
    log(`per cycle: ${per(totals.starts)} starts; sandbox-side children ${per(totals.children)} ms CPU, of which`);
    for (const [k, r] of [...rows].sort((a, b) => b[1].childMs - a[1].childMs))
      log(
        `  ${k.padEnd(28)} ${(r.count / cycles).toFixed(1)}/cycle  ${(r.childMs / r.count).toFixed(1)} ms each  ${per(r.childMs)} ms/cycle`,
      );
    log(`  ${'background (at kill)'.padEnd(28)} ${per(totals.children - foreground)} ms/cycle`);
    log(
      `starter itself ${per(totals.self)} ms/cycle (${(totals.self / totals.starts).toFixed(1)} ms/start); worker ${per(totals.worker)} ms/cycle; wall ${per(totals.wall)} ms/cycle`,
    );

    // Each layer of a start alone: the same request as a sandbox's exec, with the command `true`.
    const local = load('providers/limits') as {
      confine: (
        m: unknown,
        l: unknown,
        c: { file: string; args: string[] },
        via?: 'ulimit' | 'prlimit',
      ) => { file: string; args: string[] };
      resolveLimits: (o: unknown) => unknown;
    };
    const { bubblewrapCommands } = load('providers/bwrap') as {
      bubblewrapCommands: () => {
        wrap: (p: unknown, argv: string[], env: Record<string, string>) => { file: string; args: string[] };
      };
    };
    const { sandboxPaths } = load('providers/sandbox-state') as {
      sandboxPaths: (d: string, id: string) => Record<string, string>;
    };
    const paths = sandboxPaths(path.join(root, 'layers'), 'layers');
    for (const dir of ['workspace', 'home', 'envs']) await fs.mkdir(paths[dir], { recursive: true });
    const marker = layersMarker;
    const limits = local.resolveLimits(undefined);
    const bw = bubblewrapCommands().wrap(paths, ['/bin/true'], {});
    const layers: Record<string, { file: string; args: string[] }> = {
      true: { file: '/bin/true', args: [] },
      'prlimit true': { file: '/usr/bin/prlimit', args: ['--fsize=1000000', '--', '/bin/true'] },
      'sh join + prlimit + true': local.confine(marker, limits, { file: '/bin/true', args: [] }, 'prlimit'),
      'dash join + ulimit + true': local.confine(marker, limits, { file: '/bin/true', args: [] }, 'ulimit'),
      'bwrap true': bw,
      'dash join + ulimit + bwrap true': local.confine(marker, limits, bw, 'ulimit'),
      'sh -c true': { file: '/bin/sh', args: ['-c', 'true'] },
      'bash --norc -c true': { file: '/bin/bash', args: ['--norc', '-c', 'true'] },
      'bash, command from stdin via $(cat) (main)': {
        file: '/bin/bash',
        args: ['--norc', '-c', 'eval "$(/bin/cat)" </dev/null'],
      },
      'bash, command from stdin via read -N (now)': { file: SHELL_FROM_STDIN[0], args: SHELL_FROM_STDIN.slice(1) },
    };
    const per2 = new Map<string, { children: number; self: number }[]>();
    for (let i = 0; i < starts; i++) {
      for (const [name, cmd] of Object.entries(layers)) {
        const pid = spawnerPid()!;
        const before = stat(pid);
        const s = await startProcess({
          ...cmd,
          background: false,
          cwd: '/',
          env: { PATH: '/usr/bin:/bin' },
          maxOutputBytes: 4096,
          stdin: 'true',
        } as Request);
        await s.exited;
        const after = stat(pid);
        per2.set(name, [
          ...(per2.get(name) ?? []),
          { children: after.children - before.children, self: after.self - before.self },
        ]);
      }
    }
    log(`one start of each layer alone (${starts} interleaved reps, mean CPU):`);
    for (const [name, v] of per2) {
      const mean = (f: (x: { children: number; self: number }) => number) =>
        (v.reduce((a, x) => a + f(x), 0) / v.length).toFixed(1);
      log(`  ${name.padEnd(32)} process ${mean((x) => x.children)} ms, starter ${mean((x) => x.self)} ms`);
    }
    log(`load ${readFileSync('/proc/loadavg', 'utf8').trim()}`);
  } finally {
    if (current) await provider.destroy({ sandboxId: current, fence: 99 }, context(current)).catch(() => undefined);
    await cgroups.killGroup(layersMarker, 5000).catch(() => undefined);
    const { v2, v1 } = cgroups.hierarchies();
    for (const base of [v2, v1.pids, v1.cpu])
      if (base) await fs.rmdir(path.join(base, `h-${hostId}`)).catch(() => undefined); // our host's groups, emptied
    await provider.close?.();
    await minio.stop();
    await fs.rm(root, { recursive: true, force: true }).catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
