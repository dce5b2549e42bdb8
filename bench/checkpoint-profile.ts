import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { DeleteObjectCommand, GetObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import type { Checkpoint } from '../common/schemas';
import { freePorts } from '../platform/ports';
import { createLocalProvider } from '../providers/local';
import { sandboxPaths } from '../providers/sandbox-state';
import { startMinio } from '../platform/servers';
import { DEFAULT_ARCHIVE_LIMITS } from '../stores/archive';
import { restoreCheckpoint } from '../stores/cas/restore';
import { takeCheckpoint } from '../stores/cas/upload';
import { S3CheckpointStore } from '../stores/s3';
import { summarize } from './stats';
import { fillNodeModules, fillWorkspace, MiB } from './workspace';
import { runScript } from './script';

// Issue 16's measurement of the checkpoint engine alone (not part of `npm run bench`): the first
// snapshot (takeCheckpoint) and a restore into an empty directory (restoreCheckpoint) against a MinIO of
// its own, each repetition beside its baselines (`tar | zstd -1 -T0` + PutObject, GetObject +
// `zstd -d | tar -x` into a directory of the same filesystem), ours and the baseline's in turn so a
// swing of the machine's load hits both. Run with `node [--cpu-prof] dist/bench/checkpoint-profile.js
// <mixed MiB | files> [reps] [mixed|node_modules]`.

const DIRS = ['workspace', 'home', 'envs'];

function sh(command: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('/bin/sh', ['-c', command], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${command}: exit ${code}: ${stderr}`))));
  });
}

async function ms(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}

async function main(): Promise<void> {
  const size = Number(process.argv[2] ?? 64);
  const reps = Number(process.argv[3] ?? 3);
  const kind = process.argv[4] ?? 'mixed';
  const root = await fs.mkdtemp(path.join(os.tmpdir(), 'stasis-ckpt-profile-'));
  const [port, consolePort] = await freePorts(2);
  const env = { ...process.env };
  for (const key of ['STASIS_S3_ENDPOINT', 'MINIO_ROOT_USER', 'MINIO_ROOT_PASSWORD']) delete env[key];
  const minio = await startMinio({ dataDir: path.join(root, 'minio-data'), port, consolePort, env });
  const credentials = { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' };
  const store = new S3CheckpointStore({
    bucket: minio.bucket,
    region: minio.region,
    endpoint: minio.endpoint,
    credentials,
  });
  const s3 = new S3Client({
    endpoint: minio.endpoint,
    region: minio.region,
    forcePathStyle: true,
    credentials,
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
  const source = path.join(root, 'source');
  for (const dir of DIRS) await fs.mkdir(path.join(source, dir), { recursive: true });
  if (kind === 'mixed') await fillWorkspace(path.join(source, 'workspace'), size * MiB);
  else await fillNodeModules(path.join(source, 'workspace'), size);
  const rows: Record<string, number[]> = { take: [], tarZstd: [], put: [], restore: [], get: [], untar: [] };
  const provider = process.env.PROFILE_PROVIDER !== undefined;
  const volumes = process.env.PROFILE_PROVIDER === 'off' ? 'off' : 'auto';
  const a = createLocalProvider({ hostId: 'profile-a', dataDir: path.join(root, 'a'), store, volumes });
  const b = createLocalProvider({ hostId: 'profile-b', dataDir: path.join(root, 'b'), store, volumes });
  try {
    for (let rep = 0; rep < reps; rep++) {
      const progress = { bytes: 0 };
      let checkpoint: Checkpoint | undefined;
      const id = `profile-${rep}`;
      if (provider) {
        await a.provision({ sandboxId: id, fence: 1 }, { ownerId: id, hostId: 'profile-a' });
        const pathsA = sandboxPaths(path.join(root, 'a'), id);
        await fs.rm(pathsA.workspace, { recursive: true, force: true });
        await fs.cp(path.join(source, 'workspace'), pathsA.workspace, { recursive: true });
        await sh(`sync -f '${pathsA.volume}'`);
        await a.start({ sandboxId: id, fence: 1 }, { ownerId: id, hostId: 'profile-a' });
      }
      rows.take.push(
        await ms(async () => {
          if (provider) {
            const receipt = await a.release(
              { sandboxId: id, fence: 2, idempotencyKey: id, mode: 'SNAPSHOT_AND_TERMINATE', reason: 'profile' },
              { ownerId: id, hostId: 'profile-a' },
            );
            checkpoint = receipt.checkpoint;
            return;
          }
          ({ checkpoint } = await takeCheckpoint({
            store,
            rootDir: source,
            names: DIRS,
            prefix: `checkpoints/profile-${rep}/`,
            name: `1-${rep}`,
            labels: {},
            limits: DEFAULT_ARCHIVE_LIMITS,
            progress,
            tempPrefix: path.join(root, `packing-${rep}`),
          }));
        }),
      );
      const archive = path.join(root, 'archive.tar.zst');
      rows.tarZstd.push(
        await ms(() => sh(`tar -C '${source}' -cf - ${DIRS.join(' ')} | zstd -q -1 -T0 > '${archive}'`)),
      );
      const key = `baseline/${rep}.tar.zst`;
      const archiveBytes = (await fs.stat(archive)).size;
      rows.put.push(
        await ms(() =>
          s3.send(
            new PutObjectCommand({
              Bucket: minio.bucket,
              Key: key,
              Body: createReadStream(archive),
              ContentLength: archiveBytes,
            }),
          ),
        ),
      );
      await fs.rm(archive);
      const target = path.join(root, `restored-${rep}`);
      await fs.mkdir(target);
      rows.restore.push(
        await ms(() =>
          provider
            ? b.restore({ sandboxId: id, fence: 3, checkpoint: checkpoint! }, { ownerId: id, hostId: 'profile-b' })
            : restoreCheckpoint({
                store,
                checkpoint: checkpoint!,
                targetDir: target,
                tempPrefix: path.join(root, `download-${rep}`),
                limits: DEFAULT_ARCHIVE_LIMITS,
                progress: { bytes: 0 },
              }),
        ),
      );
      rows.get.push(
        await ms(async () => {
          const response = await s3.send(new GetObjectCommand({ Bucket: minio.bucket, Key: key }));
          if (!(response.Body instanceof Readable)) throw new Error('GetObject returned no stream');
          await pipeline(response.Body, createWriteStream(archive));
        }),
      );
      const extract = path.join(root, `extract-${rep}`);
      await fs.mkdir(extract);
      rows.untar.push(await ms(() => sh(`zstd -q -d -c '${archive}' | tar -C '${extract}' -xf -`)));
      await s3.send(new DeleteObjectCommand({ Bucket: minio.bucket, Key: key }));
      if (provider) {
        await a.destroy({ sandboxId: id, fence: 4 }, { ownerId: id, hostId: 'profile-a' });
        await b.destroy({ sandboxId: id, fence: 4 }, { ownerId: id, hostId: 'profile-b' });
      }
      await store.deletePrefix(`checkpoints/profile-${rep}/`);
      await fs.rm(archive, { force: true });
      await fs.rm(target, { recursive: true, force: true });
      await fs.rm(extract, { recursive: true, force: true });
      console.log(
        `rep ${rep}: take ${rows.take[rep].toFixed(0)} vs tar|zstd ${rows.tarZstd[rep].toFixed(0)} + put ${rows.put[rep].toFixed(0)}; ` +
          `restore ${rows.restore[rep].toFixed(0)} vs get ${rows.get[rep].toFixed(0)} + untar ${rows.untar[rep].toFixed(0)} (sent ${(progress.bytes / MiB).toFixed(1)} MiB; load ${os.loadavg()[0].toFixed(2)})`,
      );
    }
    const med = (name: string) => summarize(rows[name]).median;
    const ratio = (ours: number[], a: number[], b: number[]) =>
      summarize(ours.map((x, i) => x / (a[i] + b[i]))).median.toFixed(2);
    console.log(
      `median: take ${med('take')} vs ${med('tarZstd')} + ${med('put')} (ratio per rep, median ${ratio(rows.take, rows.tarZstd, rows.put)}); ` +
        `restore ${med('restore')} vs ${med('get')} + ${med('untar')} (ratio ${ratio(rows.restore, rows.get, rows.untar)})`,
    );
  } finally {
    s3.destroy();
    await minio.stop();
    await fs.rm(root, { recursive: true, force: true });
  }
}

runScript(main);
