import { spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createReadStream, readdirSync, readFileSync } from 'node:fs';
import { PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import type { Checkpoint } from '../common/schemas';
import { freePorts } from '../platform/ports';
import { startMinio } from '../platform/servers';
import type { SandboxProvider } from '../providers/api';
import { sandboxPaths } from '../providers/sandbox-state';
import type { CheckpointStore } from '../stores/api';
import { S3CheckpointStore } from '../stores/s3';
import { fillNodeModules, fillWorkspace, MiB } from './workspace';
import { runScript } from './script';

// Issue 16's unchanged re-suspend, stage by stage (not part of `npm run bench`): a local provider on a
// sandbox volume (the worker's default) releases with SNAPSHOT_AND_TERMINATE, resumes from its local copy,
// and releases again with nothing changed; only that second release is timed. With STAGES=1 the exports of
// the modules the release calls are wrapped to add up the wall time spent in each (nested stages overlap).
// With BASELINE_DIST=<a dist/ of another commit>, that commit's provider runs each rep too, in alternating
// order, on its own host id and data directory (its modules are loaded apart). With TAR=1 each rep also
// runs figure 4's baseline of the first release, `tar | zstd -1 -T0` + PutObject of the same files, in
// its turn. The first release's stages are kept as the second's are. Run with
// `node dist/bench/resuspend-profile.js <mixed MiB | files> [reps] [mixed|node_modules]`.

function sh(command: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('/bin/sh', ['-c', command], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${command}: exit ${code}: ${stderr}`))));
  });
}

const stages = new Map<string, number>();

/** Wraps every function export of `mod` named in `names` (`Class.method` for a prototype method). */
function wrap(label: string, mod: Record<string, unknown>, names: string[]): void {
  for (const name of names) {
    const [owner, method] = name.includes('.') ? name.split('.') : [undefined, name];
    const target = (owner ? (mod[owner] as { prototype: Record<string, unknown> }).prototype : mod) as Record<
      string,
      unknown
    >;
    const original = target[method] as (...args: unknown[]) => unknown;
    if (typeof original !== 'function') throw new Error(`${label}.${name} is not a function`);
    target[method] = function (this: unknown, ...args: unknown[]) {
      const start = performance.now();
      const add = () =>
        stages.set(`${label}.${name}`, (stages.get(`${label}.${name}`) ?? 0) + performance.now() - start);
      const result = original.apply(this, args);
      if (result instanceof Promise) {
        // takeCheckpoint's counts say whether the walk hashed files the baseline should have vouched for.
        if (name === 'takeCheckpoint')
          void result.then((r: { stats?: { files: number; filesHashed: number } }) => {
            if (r.stats) console.log(`  take: ${r.stats.files} files, ${r.stats.filesHashed} hashed`);
          });
        return result.finally(add);
      }
      add();
      return result;
    };
  }
}

/** The module of `dist` at `rel` (required, so each dist tree keeps its own instances). */
function load(dist: string, rel: string): Record<string, unknown> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return require(path.join(dist, rel)) as Record<string, unknown>;
}

function instrument(dist: string): void {
  wrap('processes', load(dist, 'providers/processes'), [
    'freezeSandbox',
    'killSandbox',
    'thawSandbox',
    'sandboxProcesses',
  ]);
  wrap('volume', load(dist, 'providers/volume'), ['mountVolume', 'unmountVolume']);
  wrap('snapshot', load(dist, 'providers/snapshot'), ['uploadSnapshot']);
  wrap('cas', load(dist, 'stores/cas/upload'), ['takeCheckpoint']);
  wrap('baseline', load(dist, 'stores/cas/baseline'), ['readBaseline', 'writeBaseline']);
  wrap('gc', load(dist, 'stores/cas/gc'), ['collectGarbage']);
  wrap('state', load(dist, 'providers/sandbox-state'), ['readState', 'writeState']);
  wrap('receipts', load(dist, 'providers/receipts'), ['ReceiptStore.replay', 'ReceiptStore.save']);
  wrap('atomic', load(dist, 'stores/atomic-file'), ['writeFileAtomic', 'makeDirDurable']);
}

function timedStore(store: S3CheckpointStore): CheckpointStore {
  const s = store as unknown as Record<string, unknown>;
  const proto = Object.getPrototypeOf(store) as Record<string, unknown>;
  for (const name of Object.getOwnPropertyNames(proto)) {
    if (name === 'constructor' || typeof proto[name] !== 'function') continue;
    const original = proto[name] as (...args: unknown[]) => unknown;
    s[name] = (...args: unknown[]) => {
      const start = performance.now();
      const result = original.apply(store, args);
      const add = () => stages.set(`store.${name}`, (stages.get(`store.${name}`) ?? 0) + performance.now() - start);
      if (result instanceof Promise) return result.finally(add);
      add();
      return result;
    };
  }
  return store;
}

/** utime + stime + cutime + cstime of a process, in ms (clock ticks of 10 ms), from /proc. */
function procCpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return [11, 12, 13, 14].reduce((sum, i) => sum + Number(fields[i]), 0) * 10;
  } catch {
    return 0; // gone meanwhile
  }
}

/** The live descendants of `pid`. */
function descendants(pid: number): number[] {
  const found: number[] = [];
  const visit = (p: number) => {
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${p}/task`);
    } catch {
      return;
    }
    for (const task of tasks) {
      let children: string;
      try {
        children = readFileSync(`/proc/${p}/task/${task}/children`, 'utf8');
      } catch {
        continue;
      }
      for (const child of children.split(' ').filter(Boolean).map(Number)) {
        found.push(child);
        visit(child);
      }
    }
  };
  visit(pid);
  return found;
}

/**
 * CPU time of this process, its waited children (a baseline's tar and zstd) and its live descendants
 * (MinIO, the zstd helper with its finished jobs), in ms: what an operation costs the machine's cores.
 */
function treeCpuMs(): number {
  return [process.pid, ...descendants(process.pid)].reduce((sum, pid) => sum + procCpuMs(pid), 0);
}

/** treeCpuMs by process (`self` for this one, else its command name). */
function treeCpuByName(): Map<string, number> {
  const byName = new Map<string, number>([['self', procCpuMs(process.pid)]]);
  for (const pid of descendants(process.pid)) {
    let name: string;
    try {
      name = readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
    } catch {
      continue;
    }
    byName.set(name, (byName.get(name) ?? 0) + procCpuMs(pid));
  }
  return byName;
}

/** What each process of the tree used between two treeCpuByName readings. */
function cpuDelta(before: Map<string, number>, after: Map<string, number>): string {
  return [...after]
    .map(([name, ms]) => [name, ms - (before.get(name) ?? 0)] as const)
    .filter(([, ms]) => ms > 0)
    .map(([name, ms]) => `${name} ${ms}`)
    .join(', ');
}

/** CPU_PROFILE=<dir>: a V8 CPU profile of each timed release alone. */
async function startProfile(): Promise<Session | undefined> {
  if (!process.env.CPU_PROFILE) return undefined;
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 200 });
  await session.post('Profiler.start');
  return session;
}

async function stopProfile(session: Session | undefined, name: string): Promise<void> {
  if (!session) return;
  const { profile } = await session.post('Profiler.stop');
  await fs.mkdir(process.env.CPU_PROFILE!, { recursive: true });
  await fs.writeFile(path.join(process.env.CPU_PROFILE!, `${name}.cpuprofile`), JSON.stringify(profile));
  session.disconnect();
}

/** The median, unrounded (summarize rounds to 0.1, too coarse for ratios). */
function median(xs: number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

interface Variant {
  name: string;
  provider: SandboxProvider;
  dataDir: string;
  hostId: string;
  ms: number[];
  firstMs: number[];
  /** The first release's CPU time in all processes (treeCpuMs). */
  firstCpu: number[];
  cpuMs: number[];
  stages: Map<string, number>[];
  firstStages: Map<string, number>[];
}

async function main(): Promise<void> {
  const size = Number(process.argv[2] ?? 64);
  const reps = Number(process.argv[3] ?? 5);
  const kind = process.argv[4] ?? 'mixed';
  const root = await fs.mkdtemp(path.join(os.tmpdir(), 'stasis-resuspend-profile-'));
  const [port, consolePort] = await freePorts(2);
  const env = { ...process.env };
  for (const key of ['STASIS_S3_ENDPOINT', 'MINIO_ROOT_USER', 'MINIO_ROOT_PASSWORD']) delete env[key];
  const minio = await startMinio({ dataDir: path.join(root, 'minio-data'), port, consolePort, env });
  const store = timedStore(
    new S3CheckpointStore({
      bucket: minio.bucket,
      region: minio.region,
      endpoint: minio.endpoint,
      credentials: { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' },
    }),
  );
  const source = path.join(root, 'source');
  await fs.mkdir(source);
  if (kind === 'mixed') await fillWorkspace(source, size * MiB);
  else await fillNodeModules(source, size);
  const dists = [['new', path.resolve(__dirname, '..')]];
  if (process.env.BASELINE_DIST) dists.push(['old', path.resolve(process.env.BASELINE_DIST)]);
  const variants: Variant[] = dists.map(([name, dist]) => {
    if (process.env.STAGES) instrument(dist);
    const { createLocalProvider } = load(dist, 'providers/local') as {
      createLocalProvider: (deps: unknown) => SandboxProvider;
    };
    const dataDir = path.join(root, name);
    const hostId = `resuspend-${name}`;
    return {
      name,
      provider: createLocalProvider({ hostId, dataDir, store, volumes: 'auto' }),
      dataDir,
      hostId,
      ms: [],
      firstMs: [],
      firstCpu: [],
      cpuMs: [],
      stages: [],
      firstStages: [],
    };
  });
  const s3 = new S3Client({
    endpoint: minio.endpoint,
    region: minio.region,
    forcePathStyle: true,
    credentials: { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' },
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
  const tarMs: number[] = [];
  const tarCpu: number[] = [];
  /** Figure 4's baseline of a first snapshot: the same files through `tar | zstd -1 -T0` to a file, then one PutObject. */
  const tarZstdPut = async (rep: number) => {
    const archive = path.join(root, 'archive.tar.zst');
    const cpu = treeCpuMs();
    const byName = treeCpuByName();
    const start = performance.now();
    await sh(`tar -C '${source}' -cf - . | zstd -q -1 -T0 > '${archive}'`);
    await s3.send(
      new PutObjectCommand({
        Bucket: minio.bucket,
        Key: `baseline/${rep}.tar.zst`,
        Body: createReadStream(archive),
        ContentLength: (await fs.stat(archive)).size,
      }),
    );
    tarMs.push(performance.now() - start);
    tarCpu.push(treeCpuMs() - cpu);
    if (process.env.CPU_BY_PROCESS) console.log(`  tar|zstd+put cpu: ${cpuDelta(byName, treeCpuByName())}`);
    await fs.rm(archive);
    console.log(`rep ${rep} tar|zstd+put: ${tarMs.at(-1)!.toFixed(1)} ms (all cpu ${tarCpu.at(-1)} ms)`);
  };
  try {
    for (let rep = 0; rep < reps; rep++) {
      const order: (Variant | 'tar')[] = process.env.TAR ? [...variants, 'tar'] : [...variants];
      if (rep % 2 === 1) order.reverse();
      for (const v of order) {
        if (v === 'tar') {
          await tarZstdPut(rep);
          continue;
        }
        const id = `rs-${rep}`;
        const ctx = { ownerId: id, hostId: v.hostId };
        let fence = 1;
        await v.provider.provision({ sandboxId: id, fence: fence++ }, ctx);
        const paths = sandboxPaths(v.dataDir, id);
        await fs.rm(paths.workspace, { recursive: true, force: true });
        await fs.cp(source, paths.workspace, { recursive: true });
        // Past the racy-timestamp margin (50 ms): files copied just before the first release would be hashed again.
        await sleep(100);
        await v.provider.start({ sandboxId: id, fence: fence++ }, ctx);
        const release = (n: number) =>
          v.provider.release(
            {
              sandboxId: id,
              fence: fence++,
              idempotencyKey: `${id}-${n}`,
              mode: 'SNAPSHOT_AND_TERMINATE',
              reason: 'profile',
            },
            ctx,
          );
        stages.clear();
        let profiling = await startProfile();
        const firstCpu = treeCpuMs();
        const firstByName = treeCpuByName();
        const firstStart = performance.now();
        const first = await release(1);
        v.firstMs.push(performance.now() - firstStart);
        v.firstCpu.push(treeCpuMs() - firstCpu);
        if (process.env.CPU_BY_PROCESS) console.log(`  first release cpu: ${cpuDelta(firstByName, treeCpuByName())}`);
        v.firstStages.push(new Map(stages));
        await stopProfile(profiling, `${v.name}-${rep}-first`);
        const local = await v.provider.restore({ sandboxId: id, fence: fence++, checkpoint: first.checkpoint! }, ctx);
        if (local.source !== 'local-copy') throw new Error(`resume used ${local.source}`);
        // What the resume wrote reaches the disk now, as the first release's did: not inside the timing.
        await sh(`sync -f '${paths.volume}'`);
        stages.clear();
        profiling = await startProfile();
        const cpu = process.cpuUsage();
        const start = performance.now();
        const again = await release(2);
        v.ms.push(performance.now() - start);
        const used = process.cpuUsage(cpu);
        v.cpuMs.push((used.user + used.system) / 1000);
        v.stages.push(new Map(stages));
        await stopProfile(profiling, `${v.name}-${rep}`);
        const checkpoint: Checkpoint = again.checkpoint!;
        if (checkpoint.uri === first.checkpoint!.uri) throw new Error('the re-suspend reused the first checkpoint');
        await v.provider.destroy({ sandboxId: id, fence: fence++ }, ctx);
        console.log(
          `rep ${rep} ${v.name}: first ${v.firstMs[rep].toFixed(1)} ms (all cpu ${v.firstCpu[rep]} ms), re-suspend ${v.ms[rep].toFixed(1)} ms (cpu ${v.cpuMs[rep].toFixed(1)}; load ${os.loadavg()[0].toFixed(2)})`,
        );
      }
    }
    for (const v of variants) {
      console.log(
        `${v.name}: median ${median(v.ms).toFixed(1)} ms, cpu ${median(v.cpuMs).toFixed(1)} ms; ` +
          `first release ${median(v.firstMs).toFixed(1)} ms (all cpu ${median(v.firstCpu)} ms); re-suspend/first per rep, median ` +
          `${median(v.ms.map((x, i) => x / v.firstMs[i])).toFixed(3)}`,
      );
      if (tarMs.length > 0)
        console.log(
          `  first/(tar|zstd+put) per rep, median ${median(v.firstMs.map((x, i) => x / tarMs[i])).toFixed(2)} ` +
            `(tar|zstd+put median ${median(tarMs).toFixed(1)} ms, all cpu ${median(tarCpu)} ms)`,
        );
      if (process.env.STAGES) {
        for (const [label, all] of [
          ['first', v.firstStages],
          ['re-suspend', v.stages],
        ] as const) {
          console.log(`  stages of the ${label} release:`);
          const names = [...new Set(all.flatMap((s) => [...s.keys()]))].sort();
          for (const name of names)
            console.log(`    ${name}: ${median(all.map((s) => s.get(name) ?? 0)).toFixed(1)} ms`);
        }
      }
    }
    if (variants.length === 2) {
      const ratios = variants[0].ms.map((x, i) => x / variants[1].ms[i]);
      console.log(`new/old per rep, median: ${median(ratios).toFixed(2)}`);
      const first = variants[0].firstMs.map((x, i) => x / variants[1].firstMs[i]);
      const firstCpu = variants[0].firstCpu.map((x, i) => x / variants[1].firstCpu[i]);
      console.log(
        `first release new/old per rep, median: ${median(first).toFixed(2)} (all cpu ${median(firstCpu).toFixed(2)})`,
      );
    }
  } finally {
    s3.destroy();
    await minio.stop();
    await fs.rm(root, { recursive: true, force: true });
  }
}

runScript(main);
