import { execFile } from 'node:child_process';
import { subscribe } from 'node:diagnostics_channel';
import { createReadStream, createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { Session } from 'node:inspector/promises';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import { GetObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { freePorts, startMinio } from '../platform/servers';
import { resolveLimits } from '../providers/limits';
import { createLocalProvider } from '../providers/local';
import { sandboxPaths } from '../providers/sandbox-state';
import { prepareVolume, removeSandboxDir, volumeSupport } from '../providers/volume';
import type { CheckpointStore } from '../stores/api';
import { restoreStages } from '../stores/cas/restore';
import { S3CheckpointStore } from '../stores/s3';
import { fillNodeModules, fillWorkspace, MiB } from './workspace';
import { runScript } from './script';

// Issue 16's diagnosis, kept to be run again (not part of `npm run bench`): where a cross-host
// restore spends its wall time, beside its baseline on the same bytes and the same MinIO (one this
// script starts). `node dist/bench/restore-profile.js [dir] [reps]` restores a node_modules-like
// workspace of 1,000 small files and a 64 MiB mixed one with the local provider on fresh hosts (no
// local copy), alternating with the baseline: GetObject of one tar.zst of the same directories,
// then `zstd -d | tar -x` onto a fresh volume like the one the restore creates (its creation timed
// apart), then `sync -f` (the restore makes its files durable before it returns). It prints each
// stage of one restore (from the marks of stores/cas/restore.ts, store requests from a wrapper),
// then medians and ratios, the CPU time this process spent per restore (its child processes, zstd
// and sync, not counted), and the load average before and after. A third argument runs only the
// shapes whose name holds it ('20,000' and '512 MiB' are the full bench's larger shapes, run only so);
// a fourth, a worktree whose `dist/` was built from another commit, restores in turn with this build
// (then each build's median time to its files written, and from there to its return, are printed too).
// STASIS_RESTORE_CPUPROFILE=<dir> writes a CPU profile of this build's last restore there.

const run = promisify(execFile);
const sh = (script: string) => run('sh', ['-c', script], { maxBuffer: 16 * MiB });

function ms(from: bigint, to: bigint): number {
  return Number(to - from) / 1e6;
}

function cpuMs(usage: NodeJS.CpuUsage): number {
  return (usage.user + usage.system) / 1000;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

interface Mark {
  stage: string;
  ns: bigint;
}

/** The store, recording each request's start and end; deletes are dropped (destroying host B's copy must not delete the checkpoint). */
function recording(store: CheckpointStore, marks: Mark[]): CheckpointStore {
  const name = (uri: string) => uri.split('/').slice(-2).join('/').slice(0, 40);
  const wrapped = Object.create(store) as CheckpointStore;
  wrapped.download = async (checkpoint, file, signal, verify) => {
    marks.push({ stage: `  GET ${name(checkpoint.uri)} start`, ns: process.hrtime.bigint() });
    const value = await store.download(checkpoint, file, signal, verify);
    marks.push({ stage: `  GET ${name(checkpoint.uri)} end`, ns: process.hrtime.bigint() });
    return value;
  };
  wrapped.read = async (uri, maxBytes, signal) => {
    marks.push({ stage: `  READ ${name(uri)} start`, ns: process.hrtime.bigint() });
    const value = await store.read(uri, maxBytes, signal);
    marks.push({ stage: `  READ ${name(uri)} end`, ns: process.hrtime.bigint() });
    return value;
  };
  wrapped.delete = async () => undefined;
  wrapped.deletePrefix = async () => 0;
  return wrapped;
}

/**
 * With STASIS_RESTORE_CPUPROFILE=<dir>, the last restore of this build is profiled (the main thread's
 * CPU, from just before it to its return): returns the function that stops and writes `<dir>/<name>`.
 */
async function startCpuProfile(): Promise<((name: string) => Promise<void>) | undefined> {
  const dir = process.env.STASIS_RESTORE_CPUPROFILE;
  if (!dir) return undefined;
  const session = new Session();
  session.connect();
  await session.post('Profiler.setSamplingInterval', { interval: 200 });
  await session.post('Profiler.enable');
  await session.post('Profiler.start');
  return async (name) => {
    const { profile } = await session.post('Profiler.stop');
    session.disconnect();
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, name), JSON.stringify(profile));
  };
}

/** When the restore had its manifest read and its files written (its marks), and the time from then to its return. */
function tail(marks: Mark[], start: bigint, end: bigint): { manifest: number; written: number; after: number } {
  const at = (stage: string) => marks.find((mark) => mark.stage === stage)?.ns ?? end;
  const written = at('files written');
  return { manifest: ms(start, at('manifest read')), written: ms(start, written), after: ms(written, end) };
}

interface Shape {
  name: string;
  fill: (dir: string) => Promise<unknown>;
}

// The last two are the full bench's larger shapes (bench/checkpoint.ts), run only when named by the third argument.
const SHAPES: Shape[] = [
  { name: '1,000 small files (node_modules-like)', fill: (dir) => fillNodeModules(dir, 1000) },
  { name: '64 MiB mixed', fill: (dir) => fillWorkspace(dir, 64 * MiB) },
  { name: '20,000 small files (node_modules-like)', fill: (dir) => fillNodeModules(dir, 20_000) },
  { name: '512 MiB mixed', fill: (dir) => fillWorkspace(dir, 512 * MiB) },
];
/** Shapes run when the third argument names none. */
const DEFAULT_SHAPES = 2;

const DIRS = ['workspace', 'home', 'envs'];

async function main(): Promise<void> {
  const root = path.resolve(process.argv[2] ?? '/tmp/stasis-restore-profile');
  const reps = Number(process.argv[3] ?? 5);
  const only = process.argv[4] || undefined;
  // Another build (its `dist/`) restores too, in turn with this one: before and after a change in one run.
  const before = process.argv[5];
  const beforeProvider = before
    ? // eslint-disable-next-line @typescript-eslint/no-require-imports
      (require(path.resolve(before, 'dist/providers/local.js')) as { createLocalProvider: typeof createLocalProvider })
        .createLocalProvider
    : undefined;
  await fs.rm(root, { recursive: true, force: true });
  await fs.mkdir(root, { recursive: true });
  const [port, consolePort] = await freePorts(2);
  // A MinIO of this script's own, whatever STASIS_S3_ENDPOINT says.
  const { STASIS_S3_ENDPOINT: _, ...env } = process.env;
  const minio = await startMinio({ dataDir: path.join(root, 'servers'), port, consolePort, env });
  const credentials = { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' };
  const s3 = new S3Client({ region: minio.region, endpoint: minio.endpoint, forcePathStyle: true, credentials });
  const store = new S3CheckpointStore({
    bucket: minio.bucket,
    region: minio.region,
    endpoint: minio.endpoint,
    credentials,
  });
  const marks: Mark[] = [];
  subscribe(restoreStages.name, (message) => marks.push(message as Mark));
  const diskMiB = resolveLimits(undefined).diskMiB;
  const volumes = volumeSupport() === undefined ? 'auto' : 'off';
  console.log(`volumes ${volumes}; load before: ${(await fs.readFile('/proc/loadavg', 'utf8')).trim()}`);
  try {
    for (const [s, shape] of SHAPES.entries()) {
      if (only ? !shape.name.includes(only) : s >= DEFAULT_SHAPES) continue;
      const id = `profile-${s}`;
      const a = createLocalProvider({ hostId: 'profile-a', dataDir: path.join(root, 'a'), store });
      const ctxA = { ownerId: id, hostId: 'profile-a' };
      await a.provision({ sandboxId: id, fence: 1 }, ctxA);
      const pathsA = sandboxPaths(path.join(root, 'a'), id);
      await fs.rm(pathsA.workspace, { recursive: true, force: true });
      await shape.fill(pathsA.workspace);
      // The baseline's archive holds the same directories as the checkpoint.
      const archive = path.join(root, `${id}.tar.zst`);
      await sh(`tar -C '${pathsA.volume}' -cf - ${DIRS.join(' ')} | zstd -q -1 -T0 > '${archive}'`);
      const key = `baseline/${id}.tar.zst`;
      const size = (await fs.stat(archive)).size;
      await s3.send(
        new PutObjectCommand({ Bucket: minio.bucket, Key: key, Body: createReadStream(archive), ContentLength: size }),
      );
      await fs.rm(archive);
      await a.start({ sandboxId: id, fence: 1 }, ctxA);
      const released = await a.release(
        { sandboxId: id, fence: 1, idempotencyKey: 'profile', mode: 'SNAPSHOT_AND_TERMINATE', reason: 'profile' },
        ctxA,
      );
      const checkpoint = released.checkpoint;
      if (!checkpoint) throw new Error('the release returned no checkpoint');
      const ours: number[] = [];
      const theirs: number[] = [];
      // CPU time of this process (all its threads) per restore: under a load that swings wall times, it tells builds apart.
      const oursCpu: number[] = [];
      // When each build's restore had its files written, and what followed (links, swap, racy window, sync).
      const oursTail: ReturnType<typeof tail>[] = [];
      const theirsTail: ReturnType<typeof tail>[] = [];
      const theirsCpu: number[] = [];
      const baseline: { get: number; volume: number; both: number; untar: number; sync: number }[] = [];
      let shown = false;
      for (let rep = 0; rep < reps; rep++) {
        const beforeRep = async () => {
          if (!beforeProvider) return;
          const hostId = `profile-c-${rep}`;
          const c = beforeProvider({ hostId, dataDir: path.join(root, hostId), store: recording(store, []), volumes });
          const ctx = { ownerId: id, hostId };
          marks.length = 0;
          const cpu = process.cpuUsage();
          const start = process.hrtime.bigint();
          const result = await c.restore({ sandboxId: id, fence: 2, checkpoint }, ctx);
          theirs.push(ms(start, process.hrtime.bigint()));
          theirsTail.push(tail(marks, start, process.hrtime.bigint()));
          theirsCpu.push(cpuMs(process.cpuUsage(cpu)));
          if (result.source !== 'checkpoint') throw new Error(`the restore used ${result.source}`);
          await c.destroy({ sandboxId: id, fence: 3 }, ctx);
        };
        const oursRep = async () => {
          const hostId = `profile-b-${rep}`;
          const b = createLocalProvider({
            hostId,
            dataDir: path.join(root, hostId),
            store: recording(store, marks),
            volumes,
          });
          const ctx = { ownerId: id, hostId };
          marks.length = 0;
          const profiling = rep === reps - 1 ? await startCpuProfile() : undefined;
          const cpu = process.cpuUsage();
          const start = process.hrtime.bigint();
          const result = await b.restore({ sandboxId: id, fence: 2, checkpoint }, ctx);
          const end = process.hrtime.bigint();
          oursCpu.push(cpuMs(process.cpuUsage(cpu)));
          await profiling?.(`${shape.name.replace(/[^0-9a-z]+/gi, '-')}.cpuprofile`);
          if (result.source !== 'checkpoint') throw new Error(`the restore used ${result.source}`);
          ours.push(ms(start, end));
          oursTail.push(tail(marks, start, end));
          if (!shown && rep === reps - 1) {
            shown = true;
            console.log(`\n${shape.name}: one cross-host restore, ${ms(start, end).toFixed(1)} ms`);
            let last = start;
            for (const mark of marks) {
              console.log(
                `  ${ms(start, mark.ns).toFixed(1).padStart(7)} ms (+${ms(last, mark.ns).toFixed(1)})  ${mark.stage}`,
              );
              last = mark.ns;
            }
            console.log(`  ${ms(start, end).toFixed(1).padStart(7)} ms (+${ms(last, end).toFixed(1)})  returned`);
          }
          await b.destroy({ sandboxId: id, fence: 3 }, ctx);
        };
        const baselineRep = async () => {
          const paths = sandboxPaths(path.join(root, `baseline-${rep}`), id);
          const file = path.join(root, `baseline-${rep}.tar.zst`);
          // The volume is made while the archive downloads, as the restore does.
          const t0 = process.hrtime.bigint();
          const [get, volume] = await Promise.all([
            (async () => {
              const response = await s3.send(new GetObjectCommand({ Bucket: minio.bucket, Key: key }));
              if (!(response.Body instanceof Readable)) throw new Error('GetObject returned no stream');
              await pipeline(response.Body, createWriteStream(file));
              return ms(t0, process.hrtime.bigint());
            })(),
            prepareVolume(paths, diskMiB, volumes).then(() => ms(t0, process.hrtime.bigint())),
          ]);
          const t2 = process.hrtime.bigint();
          await sh(`zstd -q -d -c '${file}' | tar -C '${paths.volume}' -xf -`);
          const t3 = process.hrtime.bigint();
          await sh(`sync -f '${paths.volume}'`);
          const t4 = process.hrtime.bigint();
          baseline.push({ get, volume, both: ms(t0, t2), untar: ms(t2, t3), sync: ms(t3, t4) });
          await fs.rm(file);
          await removeSandboxDir(paths);
        };
        // Each takes each place in turn.
        const turns = [oursRep, beforeRep, baselineRep];
        for (let i = 0; i < turns.length; i++) await turns[(i + rep) % turns.length]();
      }
      const part = (f: (b: (typeof baseline)[number]) => number) => median(baseline.map(f));
      const bare = part((b) => b.get + b.untar);
      const whole = part((b) => b.both + b.untar + b.sync);
      console.log(
        `${shape.name}, ${reps} reps in turn: baseline GetObject ${part((b) => b.get).toFixed(0)} ms and volume ${part((b) => b.volume).toFixed(0)} ms ` +
          `at once ${part((b) => b.both).toFixed(0)} ms, then untar ${part((b) => b.untar).toFixed(0)} + sync ${part((b) => b.sync).toFixed(0)} ms`,
      );
      const ratios = (label: string, values: number[]) =>
        console.log(
          `  ${label}: median ${median(values).toFixed(0)} ms (${values.map((v) => v.toFixed(0)).join(' ')}); ` +
            `/ (GetObject + untar) ${(median(values) / bare).toFixed(2)}; ` +
            `/ (GetObject and volume at once + untar + sync) ${(median(values) / whole).toFixed(2)}`,
        );
      ratios('this build', ours);
      if (theirs.length > 0) {
        ratios(`build of ${before}`, theirs);
        // Each rep's two restores ran next to each other: their ratio is less swayed by a load that changes over the run.
        const paired = ours.map((value, i) => value / theirs[i]);
        console.log(
          `  this build / that build, per rep: median ${median(paired).toFixed(2)} (${paired.map((r) => r.toFixed(2)).join(' ')})`,
        );
      }
      const cpu = (label: string, values: number[]) =>
        console.log(`  ${label}: CPU of this process per restore, median ${median(values).toFixed(0)} ms`);
      const tails = (label: string, values: typeof oursTail) =>
        values.length > 0 &&
        console.log(
          `  ${label}: manifest read at median ${median(values.map((v) => v.manifest)).toFixed(0)} ms, ` +
            `files written at median ${median(values.map((v) => v.written)).toFixed(0)} ms, ` +
            `then ${median(values.map((v) => v.after)).toFixed(0)} ms to the return`,
        );
      tails('this build', oursTail);
      tails(`build of ${before}`, theirsTail);
      cpu('this build', oursCpu);
      if (theirsCpu.length > 0) {
        cpu(`build of ${before}`, theirsCpu);
        // Per rep, as for the wall times: the CPU a load takes from each also changes over the run.
        const paired = oursCpu.map((value, i) => value / theirsCpu[i]);
        console.log(
          `  this build / that build, CPU per rep: median ${median(paired).toFixed(2)} (${paired.map((r) => r.toFixed(2)).join(' ')})`,
        );
      }
      await a.destroy({ sandboxId: id, fence: 3 }, ctxA);
    }
  } finally {
    console.log(`load after: ${(await fs.readFile('/proc/loadavg', 'utf8')).trim()}`);
    await minio.stop();
    await fs.rm(root, { recursive: true, force: true });
  }
}

runScript(main);
