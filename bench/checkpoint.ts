import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { DeleteObjectCommand, GetObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import type { Checkpoint } from '../common/schemas';
import type { RequestContext, SandboxProvider } from '../providers/api';
import { createLocalProvider } from '../providers/local';
import { sandboxPaths } from '../providers/sandbox-state';
import type { BenchEnv } from './env';
import { summarize, timed, type Summary } from './stats';
import { fillWorkspace, MiB } from './workspace';

// Figure 4: checkpoint speed of the local provider against the S3 store
// (MinIO), against `tar | gzip -1` to a file and a plain PutObject of the
// archive (and GetObject + `tar -xzf` the other way), in the same run.

export interface CheckpointResult {
  sizeMiB: number;
  files: number;
  archiveMiB: number;
  /** release SNAPSHOT_AND_TERMINATE of a running sandbox: pack, gzip, hash and multipart upload. */
  snapshotUploadMs: Summary;
  /** Baseline: `tar -cf - | gzip -1 > file`, then one PutObject of that file. */
  tarGzipMs: Summary;
  putObjectMs: Summary;
  /** restore on another host: download, verify sha-256, validate every entry, extract. */
  downloadRestoreMs: Summary;
  /** Baseline: GetObject to a file, then `tar -xzf`. */
  getObjectMs: Summary;
  tarExtractMs: Summary;
  /** Second release of the same stopped sandbox, nothing changed: the checkpoint is reused (one HeadObject). */
  secondSuspendReusedMs: Summary;
  /** Same-host resume from the dormant copy (no download). */
  localResumeMs: Summary;
  /** Suspend right after that resume, files unchanged: compute ran, so the provider snapshots again. */
  resuspendAfterResumeMs: Summary;
  reused: boolean;
  errors: string[];
}

function sh(command: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('/bin/sh', ['-c', command], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${command}: exit ${code}: ${stderr}`))));
  });
}

function s3For(env: BenchEnv): S3Client {
  const { minio } = env;
  return new S3Client({
    endpoint: minio.endpoint,
    region: minio.region,
    forcePathStyle: true,
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    ...(minio.accessKeyId && minio.secretAccessKey
      ? { credentials: { accessKeyId: minio.accessKeyId, secretAccessKey: minio.secretAccessKey } }
      : {}),
  });
}

interface Rep {
  snapshotUploadMs: number;
  tarGzipMs: number;
  putObjectMs: number;
  downloadRestoreMs: number;
  getObjectMs: number;
  tarExtractMs: number;
  secondSuspendReusedMs: number;
  localResumeMs: number;
  resuspendAfterResumeMs: number;
  archiveBytes: number;
  reused: boolean;
}

async function oneRep(
  env: BenchEnv,
  s3: S3Client,
  a: SandboxProvider,
  b: SandboxProvider,
  source: string,
  sizeMiB: number,
  rep: number,
): Promise<Rep> {
  const sandboxId = `ckpt-${sizeMiB}-${rep}`;
  const ctxA: RequestContext = { ownerId: sandboxId, hostId: 'bench-ckpt-a' };
  const ctxB: RequestContext = { ownerId: sandboxId, hostId: 'bench-ckpt-b' };
  const pathsA = sandboxPaths(path.join(env.scratch, 'ckpt-a'), sandboxId);
  await a.provision({ sandboxId, fence: 1 }, ctxA);
  await fs.rm(pathsA.workspace, { recursive: true, force: true });
  await fs.cp(source, pathsA.workspace, { recursive: true });
  await a.start({ sandboxId, fence: 1 }, ctxA);
  const key = (fence: number) => ({
    sandboxId,
    fence,
    idempotencyKey: `${sandboxId}/${fence}/release`,
    mode: 'SNAPSHOT_AND_TERMINATE' as const,
    reason: 'bench',
  });
  const checkpoints: Checkpoint[] = [];
  try {
    const first = await timed(() => a.release(key(1), ctxA));
    if (first.value.checkpoint) checkpoints.push(first.value.checkpoint);
    const second = await timed(() => a.release(key(2), ctxA));
    if (second.value.checkpoint) checkpoints.push(second.value.checkpoint);
    const reused = second.value.checkpoint?.uri === first.value.checkpoint?.uri;
    const checkpoint = first.value.checkpoint;
    if (!checkpoint) throw new Error('snapshot release returned no checkpoint');
    const local = await timed(() => a.restore({ sandboxId, fence: 3, checkpoint }, ctxA));
    if (local.value.source !== 'local-copy')
      throw new Error(`same-host resume used ${local.value.source}, not the local copy`);
    const again = await timed(() => a.release(key(4), ctxA));
    if (again.value.checkpoint) checkpoints.push(again.value.checkpoint);
    const remote = await timed(() => b.restore({ sandboxId, fence: 5, checkpoint }, ctxB));
    if (remote.value.source !== 'checkpoint') throw new Error(`cross-host restore used ${remote.value.source}`);

    // Baselines on the same bytes (the directories the checkpoint holds).
    const archive = path.join(env.scratch, `${sandboxId}.tar.gz`);
    const tarGzip = await timed(() => sh(`tar -C '${pathsA.root}' -cf - workspace home envs | gzip -1 > '${archive}'`));
    const archiveBytes = (await fs.stat(archive)).size;
    const objectKey = `baseline/${sandboxId}.tar.gz`;
    const put = await timed(() =>
      s3.send(
        new PutObjectCommand({
          Bucket: env.minio.bucket,
          Key: objectKey,
          Body: createReadStream(archive),
          ContentLength: archiveBytes,
        }),
      ),
    );
    await fs.rm(archive);
    const get = await timed(async () => {
      const response = await s3.send(new GetObjectCommand({ Bucket: env.minio.bucket, Key: objectKey }));
      if (!(response.Body instanceof Readable)) throw new Error('GetObject returned no stream');
      await pipeline(response.Body, createWriteStream(archive));
    });
    const extractDir = path.join(env.scratch, `${sandboxId}-extract`);
    await fs.mkdir(extractDir);
    const extract = await timed(() => sh(`tar -C '${extractDir}' -xzf '${archive}'`));
    await fs.rm(extractDir, { recursive: true, force: true });
    await fs.rm(archive, { force: true });
    await s3.send(new DeleteObjectCommand({ Bucket: env.minio.bucket, Key: objectKey }));
    return {
      snapshotUploadMs: first.ms,
      secondSuspendReusedMs: second.ms,
      localResumeMs: local.ms,
      resuspendAfterResumeMs: again.ms,
      downloadRestoreMs: remote.ms,
      tarGzipMs: tarGzip.ms,
      putObjectMs: put.ms,
      getObjectMs: get.ms,
      tarExtractMs: extract.ms,
      archiveBytes,
      reused,
    };
  } finally {
    await a.destroy({ sandboxId, fence: 6 }, ctxA).catch(() => undefined);
    await b.destroy({ sandboxId, fence: 6 }, ctxB).catch(() => undefined);
    for (const c of new Set(checkpoints.map((x) => x.uri))) await env.store.delete(c).catch(() => undefined);
  }
}

export async function runCheckpointBench(
  env: BenchEnv,
  sizesMiB: number[],
  reps: number,
  log: (line: string) => void,
): Promise<CheckpointResult[]> {
  const a = createLocalProvider({
    hostId: 'bench-ckpt-a',
    dataDir: path.join(env.scratch, 'ckpt-a'),
    store: env.store,
  });
  const b = createLocalProvider({
    hostId: 'bench-ckpt-b',
    dataDir: path.join(env.scratch, 'ckpt-b'),
    store: env.store,
  });
  const s3 = s3For(env);
  const results: CheckpointResult[] = [];
  try {
    for (const sizeMiB of sizesMiB) {
      const source = path.join(env.scratch, `source-${sizeMiB}`);
      const shape = await fillWorkspace(source, sizeMiB * MiB);
      const reps_: Rep[] = [];
      const errors: string[] = [];
      // A 512 MiB repetition takes minutes on 2 cores: one of them fits the budget.
      const repsHere = sizeMiB >= 256 ? 1 : reps;
      for (let r = 0; r < repsHere; r++) {
        try {
          reps_.push(await oneRep(env, s3, a, b, source, sizeMiB, r));
        } catch (err) {
          errors.push(String(err));
        }
      }
      await fs.rm(source, { recursive: true, force: true });
      const pick = (k: keyof Omit<Rep, 'reused' | 'archiveBytes'>) => summarize(reps_.map((x) => x[k]));
      const result: CheckpointResult = {
        sizeMiB,
        files: shape.files,
        archiveMiB: Math.round((reps_[0]?.archiveBytes ?? 0) / MiB),
        snapshotUploadMs: pick('snapshotUploadMs'),
        tarGzipMs: pick('tarGzipMs'),
        putObjectMs: pick('putObjectMs'),
        downloadRestoreMs: pick('downloadRestoreMs'),
        getObjectMs: pick('getObjectMs'),
        tarExtractMs: pick('tarExtractMs'),
        secondSuspendReusedMs: pick('secondSuspendReusedMs'),
        localResumeMs: pick('localResumeMs'),
        resuspendAfterResumeMs: pick('resuspendAfterResumeMs'),
        reused: reps_.length > 0 && reps_.every((x) => x.reused),
        errors,
      };
      log(
        `checkpoint ${sizeMiB} MiB (${shape.files} files): snapshot+upload ${result.snapshotUploadMs.median} ms vs tar|gzip ${result.tarGzipMs.median} + PutObject ${result.putObjectMs.median}; ` +
          `download+restore ${result.downloadRestoreMs.median} ms vs GetObject ${result.getObjectMs.median} + tar -x ${result.tarExtractMs.median}; second suspend ${result.secondSuspendReusedMs.median} ms` +
          (errors.length ? `; errors: ${errors[0]}` : ''),
      );
      results.push(result);
    }
  } finally {
    s3.destroy();
    await a.close();
    await b.close();
  }
  return results;
}
