import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import {
  DeleteObjectCommand,
  GetObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
} from '@aws-sdk/client-s3';
import type { Checkpoint } from '../common/schemas';
import type { RequestContext, SandboxProvider } from '../providers/api';
import { createLocalProvider } from '../providers/local';
import { resolveLimits } from '../providers/limits';
import { sandboxPaths } from '../providers/sandbox-state';
import { withLifecycleLock } from '../providers/lock';
import { mountVolume, prepareVolume, removeSandboxDir } from '../providers/volume';
import type { CheckpointStore } from '../stores/api';
import type { BenchEnv } from './env';
import { summarize, timed, type Summary } from './stats';
import { fillNodeModules, fillWorkspace, MiB, type WorkspaceShape } from './workspace';

// Figure 4: the content-addressed checkpoints of the local provider against the
// S3 store (MinIO), each row beside its baselines in the same run on the same
// bytes and the same MinIO: `tar | zstd -1 -T0` + PutObject (GetObject +
// `zstd -d | tar -x` back) and restic (backup, restore, incremental backup).
// The hosts keep sandboxes on their own volumes (the worker's default), and the
// baselines extract onto a fresh volume of the same kind: creating 20,000 files
// costs what the filesystem makes it cost, and the busy host root filesystem
// made that cost swing from one moment to the next. Ours and the baselines run
// one right after the other, in turns (ours first in even repetitions, the
// baselines first in odd ones), so a swing of the machine's load hits both.

/** A workspace the figure measures. */
export interface CheckpointWorkspace {
  name: string;
  kind: 'mixed' | 'node_modules';
  /** Mixed: total MiB; node_modules: the number of files. */
  size: number;
}

/** One timed operation and the bytes it sent to the store (medians over the repetitions). */
export interface Transfer {
  ms: Summary;
  bytes: number;
}

export interface IncrementalRow {
  change: string;
  /** Stasis: `release(SNAPSHOT_AND_TERMINATE)` right after a same-host resume and the change. */
  stasis: Transfer;
  /** Of `stasis.bytes`, the bytes of packs (file contents); the rest is the manifest. */
  stasisPackBytes: number;
  /** restic's incremental backup of the same change (bytes: how much its repository grew). */
  restic?: Transfer;
}

export interface CheckpointResult {
  workspace: string;
  /** Bytes and files of the workspace. */
  bytes: number;
  files: number;
  /** First snapshot + upload of a running sandbox. */
  first: Transfer;
  /** Baseline: `tar -cf - | zstd -1 -T0 > file`, then one PutObject of it (bytes: the archive). */
  tarZstd: Transfer;
  putObjectMs: Summary;
  /** Baseline: the first `restic backup` of the same tree to a new repository in the same MinIO (bytes: the repository's size). */
  resticFirst?: Transfer;
  /** `restore` on another host (no local copy): download, verify, make the volume, extract, sync, start. */
  crossHostRestoreMs: Summary;
  /** Baseline: GetObject to a file while a fresh volume is made (the two at once). */
  getObjectMs: Summary;
  /** Baseline: `zstd -d | tar -x` onto that volume, then `sync -f` of it. */
  untarMs: Summary;
  /** Baseline: `restic restore latest` into an empty directory (no cache). */
  resticRestoreMs?: Summary;
  incremental: IncrementalRow[];
  errors: string[];
}

function sh(command: string, env?: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('/bin/sh', ['-c', command], { stdio: ['ignore', 'pipe', 'pipe'], env: env ?? process.env });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) =>
      code === 0 ? resolve(stdout) : reject(new Error(`${command}: exit ${code}: ${stderr.slice(-500)}`)),
    );
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

/** The store the providers use, counting the bytes every `put` and `putBytes` sends (packs apart from manifests). */
function countingStore(store: CheckpointStore): { store: CheckpointStore; sent: { packs: number; other: number } } {
  const sent = { packs: 0, other: 0 };
  const counted: CheckpointStore = {
    kind: store.kind,
    put(key, body, labels, signal) {
      const count = new Transform({
        transform(chunk: Buffer, _encoding, callback) {
          if (key.includes('/packs/')) sent.packs += chunk.length;
          else sent.other += chunk.length;
          callback(null, chunk);
        },
      });
      body.on('error', (err) => count.destroy(err));
      return store.put(key, body.pipe(count), labels, signal);
    },
    // The caller's sha-256 passed on: without it the store hashed each raw pack again on the event loop.
    putBytes(key, bytes, labels, signal, sha256) {
      if (key.includes('/packs/')) sent.packs += bytes.length;
      else sent.other += bytes.length;
      return store.putBytes(key, bytes, labels, signal, sha256);
    },
    download: (c, file, signal, verify) => store.download(c, file, signal, verify),
    delete: (uri) => store.delete(uri),
    uriOf: (key) => store.uriOf(key),
    exists: (uri) => store.exists(uri),
    deletePrefix: (prefix) => store.deletePrefix(prefix),
    read: (uri, maxBytes, signal) => store.read(uri, maxBytes, signal),
    list: (prefix) => store.list(prefix),
  };
  return { store: counted, sent };
}

/** restic against a repository in the bench's MinIO; undefined when the `restic` command is missing. */
async function resticFor(env: BenchEnv): Promise<((args: string) => Promise<string>) | undefined> {
  try {
    await sh('restic version');
  } catch {
    return undefined;
  }
  const resticEnv = {
    ...process.env,
    RESTIC_PASSWORD: 'stasis-bench',
    RESTIC_CACHE_DIR: path.join(env.scratch, 'restic-cache'),
    AWS_ACCESS_KEY_ID: env.minio.accessKeyId ?? '',
    AWS_SECRET_ACCESS_KEY: env.minio.secretAccessKey ?? '',
  };
  return (args) => sh(`restic ${args}`, resticEnv);
}

type Restic = (args: string) => Promise<string>;

/** Bytes of all objects under `prefix` in the bench's bucket. */
async function bytesUnder(s3: S3Client, bucket: string, prefix: string): Promise<number> {
  let bytes = 0;
  let token: string | undefined;
  do {
    const page = await s3.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix, ContinuationToken: token }));
    for (const o of page.Contents ?? []) bytes += o.Size ?? 0;
    token = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (token);
  return bytes;
}

/**
 * Runs `restic backup` of `dirs` in `cwd` into the repository at `prefix` of the bucket; its wall
 * time and how much the repository grew (what restic uploaded, after its compression).
 */
async function resticBackup(
  restic: Restic,
  s3: S3Client,
  env: BenchEnv,
  prefix: string,
  cwd: string,
  dirs: string[],
): Promise<{ ms: number; bytes: number }> {
  const before = await bytesUnder(s3, env.minio.bucket, `${prefix}/`);
  const run = await timed(() =>
    restic(
      `-r '${resticRepo(env, prefix)}' backup --quiet --host bench ${dirs.map((d) => `'${path.join(cwd, d)}'`).join(' ')}`,
    ),
  );
  return { ms: run.ms, bytes: (await bytesUnder(s3, env.minio.bucket, `${prefix}/`)) - before };
}

const resticRepo = (env: BenchEnv, prefix: string): string => `s3:${env.minio.endpoint}/${env.minio.bucket}/${prefix}`;

/** The files under `dir` smaller than 1 MiB, sorted (the "source" files a checkout rewrites). */
async function smallFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await fs.readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const file = path.join(entry.parentPath, entry.name);
    if ((await fs.stat(file)).size < MiB) out.push(file);
  }
  return out.sort();
}

interface Change {
  name: string;
  /** Makes the change in the workspace; undefined when the workspace has nothing it applies to. */
  apply: (workspace: string, round: number) => Promise<void>;
  applies: (kind: CheckpointWorkspace['kind']) => boolean;
}

const CHANGES: Change[] = [
  { name: 'unchanged, after a resume', apply: async () => undefined, applies: () => true },
  {
    name: 'one small file changed',
    applies: () => true,
    apply: async (workspace, round) => {
      const [first] = await smallFiles(workspace);
      const old = await fs.readFile(first);
      const stamp = Buffer.from(`// changed ${round}\n`);
      await fs.writeFile(first, Buffer.concat([stamp, old.subarray(stamp.length)]));
    },
  },
  {
    name: '1 MiB appended to a large file',
    applies: (kind) => kind === 'mixed',
    apply: async (workspace) => {
      const { randomBytes } = await import('node:crypto');
      await fs.appendFile(path.join(workspace, 'blob-0.bin'), randomBytes(MiB));
    },
  },
  {
    // Like checking out another branch: 5% of the small files rewritten, 1% deleted, 1% added.
    name: 'checkout of another branch (many small files)',
    applies: () => true,
    apply: async (workspace, round) => {
      const files = await smallFiles(workspace);
      for (let i = 0; i < files.length; i++) {
        if (i % 20 === 3) {
          const old = await fs.readFile(files[i]);
          await fs.writeFile(
            files[i],
            Buffer.concat([Buffer.from(`// branch ${round} ${i}\n`), old.subarray(0, old.length / 2), old]),
          );
        } else if (i % 100 === 7) await fs.rm(files[i]);
        else if (i % 100 === 11) {
          const old = await fs.readFile(files[i]);
          await fs.writeFile(`${files[i]}.new.js`, Buffer.concat([Buffer.from(`// added ${round} ${i}\n`), old]));
        }
      }
    },
  },
];

interface Rep {
  first: { ms: number; bytes: number };
  tarZstd: { ms: number; bytes: number };
  putObjectMs: number;
  resticFirst?: { ms: number; bytes: number };
  crossHostRestoreMs: number;
  getObjectMs: number;
  untarMs: number;
  resticRestoreMs?: number;
  incremental: {
    change: string;
    ms: number;
    bytes: number;
    packBytes: number;
    restic?: { ms: number; bytes: number };
  }[];
}

const DIRS = ['workspace', 'home', 'envs'];

async function oneRep(
  env: BenchEnv,
  s3: S3Client,
  a: SandboxProvider,
  b: SandboxProvider,
  sent: { packs: number; other: number },
  restic: Restic | undefined,
  source: string,
  ws: CheckpointWorkspace,
  rep: number,
): Promise<Rep> {
  const sandboxId = `ckpt-${ws.kind}-${ws.size}-${rep}`;
  const ctxA: RequestContext = { ownerId: sandboxId, hostId: 'bench-ckpt-a' };
  const ctxB: RequestContext = { ownerId: sandboxId, hostId: 'bench-ckpt-b' };
  const pathsA = sandboxPaths(path.join(env.scratch, 'ckpt-a'), sandboxId);
  const resticPrefix = `restic-${sandboxId}`;
  const repo = resticRepo(env, resticPrefix);
  await a.provision({ sandboxId, fence: 1 }, ctxA);
  await fs.rm(pathsA.workspace, { recursive: true, force: true });
  await fs.cp(source, pathsA.workspace, { recursive: true });
  await a.start({ sandboxId, fence: 1 }, ctxA);
  let fence = 1;
  const release = async () => {
    const f = fence++;
    const before = sent.packs + sent.other;
    const packsBefore = sent.packs;
    const r = await timed(() =>
      a.release(
        {
          sandboxId,
          fence: f,
          idempotencyKey: `${sandboxId}/${f}/release`,
          mode: 'SNAPSHOT_AND_TERMINATE',
          reason: 'bench',
        },
        ctxA,
      ),
    );
    if (!r.value.checkpoint) throw new Error('snapshot release returned no checkpoint');
    return {
      ms: r.ms,
      bytes: sent.packs + sent.other - before,
      packBytes: sent.packs - packsBefore,
      checkpoint: r.value.checkpoint,
    };
  };
  const checkpoints: Checkpoint[] = [];
  const scratch = path.join(env.scratch, `${sandboxId}-baseline`);
  await fs.mkdir(scratch, { recursive: true });
  // The baselines extract onto a fresh volume like the one a cross-host restore creates (a plain directory of
  // the same filesystem where the host cannot mount volumes).
  const pathsX = sandboxPaths(path.join(env.scratch, 'ckpt-x'), sandboxId);
  const oursFirst = rep % 2 === 0;
  try {
    // The copy reaches the volume's disk now: a release unmounts the volume, which would write it back inside the timing.
    await sh(`sync -f '${pathsA.volume}'`);
    const archive = path.join(scratch, 'archive.tar.zst');
    const objectKey = `baseline/${sandboxId}.tar.zst`;
    // Baselines of the first suspend on the same bytes (the directories the checkpoint holds).
    const baselineSnapshot = async () => {
      // Ours unmounts the sandbox's volume when it ran first: mounted again (untimed) for tar to read it,
      // under the sandbox's lock (behind the unmount the release left for after its receipt).
      await withLifecycleLock(sandboxId, () => mountVolume(pathsA));
      // Mounted again, its files are no longer in the page cache, as they were for ours: read once (untimed), so
      // both read warm. Before this, the baseline read cold in every repetition ours ran first (20,000 small
      // files: ~1.5 s instead of ~0.3 s), which made ours look as fast as it in half the repetitions.
      if (oursFirst) await sh(`tar -C '${pathsA.volume}' -cf - ${DIRS.join(' ')} | cat > /dev/null`);
      const tarZstd = await timed(() =>
        sh(`tar -C '${pathsA.volume}' -cf - ${DIRS.join(' ')} | zstd -q -1 -T0 > '${archive}'`),
      );
      const archiveBytes = (await fs.stat(archive)).size;
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
      return { tarZstd: { ms: tarZstd.ms, bytes: archiveBytes }, putObjectMs: put.ms };
    };
    let first: Awaited<ReturnType<typeof release>>;
    let baseline: Awaited<ReturnType<typeof baselineSnapshot>>;
    if (oursFirst) {
      first = await release();
      baseline = await baselineSnapshot();
    } else {
      baseline = await baselineSnapshot();
      first = await release();
    }
    checkpoints.push(first.checkpoint);
    let resticFirst: { ms: number; bytes: number } | undefined;
    if (restic) {
      await restic(`-r '${repo}' init`);
      await withLifecycleLock(sandboxId, () => mountVolume(pathsA));
      // Warm, as ours read them (see baselineSnapshot).
      await sh(`tar -C '${pathsA.volume}' -cf - ${DIRS.join(' ')} | cat > /dev/null`);
      resticFirst = await resticBackup(restic, s3, env, resticPrefix, pathsA.volume, DIRS);
    }

    // Cross-host restore, and its baselines. Destroyed only at the end: destroying a sandbox deletes its
    // checkpoints, which the re-suspends below build on.
    await prepareVolume(pathsX, resolveLimits(undefined).diskMiB, 'auto');
    const extractDir = path.join(pathsX.volume, 'extract');
    const crossHost = async () => {
      const remote = await timed(() => b.restore({ sandboxId, fence: fence++, checkpoint: first.checkpoint }, ctxB));
      if (remote.value.source !== 'checkpoint') throw new Error(`cross-host restore used ${remote.value.source}`);
      return remote.ms;
    };
    // The same work as the restore's: it makes a fresh volume (while it downloads) and syncs the files it wrote
    // before it answers, so the baseline makes one while GetObject runs (getObjectMs is the two at once) and
    // syncs after extracting (untarMs holds the sync). Before, the baseline's volume was made untimed and never synced.
    let fresh = 0;
    const baselineRestore = async () => {
      const pathsF = sandboxPaths(path.join(env.scratch, 'ckpt-x'), `${sandboxId}-f${fresh++}`);
      const get = await timed(() =>
        Promise.all([
          (async () => {
            const response = await s3.send(new GetObjectCommand({ Bucket: env.minio.bucket, Key: objectKey }));
            if (!(response.Body instanceof Readable)) throw new Error('GetObject returned no stream');
            await pipeline(response.Body, createWriteStream(archive));
          })(),
          prepareVolume(pathsF, resolveLimits(undefined).diskMiB, 'auto'),
        ]),
      );
      const untar = await timed(() =>
        sh(`zstd -q -d -c '${archive}' | tar -C '${pathsF.volume}' -xf - && sync -f '${pathsF.volume}'`),
      );
      await removeSandboxDir(pathsF);
      await fs.rm(archive, { force: true });
      return { getObjectMs: get.ms, untarMs: untar.ms };
    };
    let crossHostRestoreMs: number;
    let back: Awaited<ReturnType<typeof baselineRestore>>;
    if (oursFirst) {
      crossHostRestoreMs = await crossHost();
      back = await baselineRestore();
    } else {
      back = await baselineRestore();
      crossHostRestoreMs = await crossHost();
    }
    await s3.send(new DeleteObjectCommand({ Bucket: env.minio.bucket, Key: objectKey }));
    let resticRestoreMs: number | undefined;
    if (restic) {
      await fs.mkdir(extractDir);
      resticRestoreMs = (await timed(() => restic(`-r '${repo}' --no-cache restore latest --target '${extractDir}'`)))
        .ms;
      await fs.rm(extractDir, { recursive: true, force: true });
    }

    // Re-suspends after a same-host resume and a change, each beside restic's incremental backup of it.
    const incremental: Rep['incremental'] = [];
    let latest = first.checkpoint;
    for (const change of CHANGES.filter((c) => c.applies(ws.kind))) {
      const local = await a.restore({ sandboxId, fence: fence++, checkpoint: latest }, ctxA);
      if (local.source !== 'local-copy') throw new Error(`same-host resume used ${local.source}, not the local copy`);
      await change.apply(pathsA.workspace, rep);
      const again = await release();
      checkpoints.push(again.checkpoint);
      latest = again.checkpoint;
      // The release unmounted the sandbox's volume: mounted again for restic to read it.
      if (restic) await withLifecycleLock(sandboxId, () => mountVolume(pathsA));
      const r = restic ? await resticBackup(restic, s3, env, resticPrefix, pathsA.volume, DIRS) : undefined;
      incremental.push({
        change: change.name,
        ms: again.ms,
        bytes: again.bytes,
        packBytes: again.packBytes,
        ...(r ? { restic: r } : {}),
      });
    }
    return {
      first: { ms: first.ms, bytes: first.bytes },
      ...baseline,
      ...(resticFirst ? { resticFirst } : {}),
      crossHostRestoreMs,
      ...back,
      ...(resticRestoreMs !== undefined ? { resticRestoreMs } : {}),
      incremental,
    };
  } finally {
    await a.destroy({ sandboxId, fence: fence + 1 }, ctxA).catch(() => undefined);
    await b.destroy({ sandboxId, fence: fence + 1 }, ctxB).catch(() => undefined);
    await removeSandboxDir(pathsX).catch(() => undefined);
    for (const c of new Set(checkpoints.map((x) => x.uri))) await env.store.delete(c).catch(() => undefined);
    await fs.rm(scratch, { recursive: true, force: true });
  }
}

const median = (xs: number[]): number => summarize(xs).median;
const transfer = (xs: { ms: number; bytes: number }[]): Transfer => ({
  ms: summarize(xs.map((x) => x.ms)),
  bytes: median(xs.map((x) => x.bytes)),
});

function combine(ws: CheckpointWorkspace, shape: WorkspaceShape, reps: Rep[], errors: string[]): CheckpointResult {
  const some = <T>(xs: (T | undefined)[]): T[] | undefined =>
    xs.every((x) => x !== undefined) && xs.length ? (xs as T[]) : undefined;
  const resticFirst = some(reps.map((r) => r.resticFirst));
  const resticRestore = some(reps.map((r) => r.resticRestoreMs));
  const changes = reps[0]?.incremental.map((i) => i.change) ?? [];
  return {
    workspace: ws.name,
    bytes: shape.bytes,
    files: shape.files,
    first: transfer(reps.map((r) => r.first)),
    tarZstd: transfer(reps.map((r) => r.tarZstd)),
    putObjectMs: summarize(reps.map((r) => r.putObjectMs)),
    ...(resticFirst ? { resticFirst: transfer(resticFirst) } : {}),
    crossHostRestoreMs: summarize(reps.map((r) => r.crossHostRestoreMs)),
    getObjectMs: summarize(reps.map((r) => r.getObjectMs)),
    untarMs: summarize(reps.map((r) => r.untarMs)),
    ...(resticRestore ? { resticRestoreMs: summarize(resticRestore) } : {}),
    incremental: changes.map((change) => {
      const rows = reps.map((r) => r.incremental.find((i) => i.change === change)!);
      const restic = some(rows.map((x) => x.restic));
      return {
        change,
        stasis: transfer(rows),
        stasisPackBytes: median(rows.map((x) => x.packBytes)),
        ...(restic ? { restic: transfer(restic) } : {}),
      };
    }),
    errors,
  };
}

/** The workspaces of the figure, and whether restic was found (its columns are left out when not). */
export async function runCheckpointBench(
  env: BenchEnv,
  workspaces: CheckpointWorkspace[],
  reps: number,
  log: (line: string) => void,
): Promise<{ results: CheckpointResult[]; restic: boolean }> {
  const { store, sent } = countingStore(env.store);
  // Sandbox volumes where the host can mount them, as the worker's default (STASIS_SANDBOX_VOLUMES=auto).
  const volumes = 'auto';
  const a = createLocalProvider({
    hostId: 'bench-ckpt-a',
    dataDir: path.join(env.scratch, 'ckpt-a'),
    store,
    volumes,
  });
  const b = createLocalProvider({
    hostId: 'bench-ckpt-b',
    dataDir: path.join(env.scratch, 'ckpt-b'),
    store,
    volumes,
  });
  const s3 = s3For(env);
  const restic = await resticFor(env);
  if (!restic) log('checkpoint: the restic command is not installed: its columns are left out');
  const results: CheckpointResult[] = [];
  try {
    for (const ws of workspaces) {
      const source = path.join(env.scratch, `source-${ws.kind}-${ws.size}`);
      const shape =
        ws.kind === 'mixed' ? await fillWorkspace(source, ws.size * MiB) : await fillNodeModules(source, ws.size);
      const done: Rep[] = [];
      const errors: string[] = [];
      // A 512 MiB repetition takes minutes on 2 cores: one of them fits the budget.
      const repsHere = ws.kind === 'mixed' && ws.size >= 256 ? 1 : reps;
      for (let r = 0; r < repsHere; r++) {
        try {
          done.push(await oneRep(env, s3, a, b, sent, restic, source, ws, r));
        } catch (err) {
          errors.push(String(err));
        }
      }
      await fs.rm(source, { recursive: true, force: true });
      const result = combine(ws, shape, done, errors);
      log(
        `checkpoint ${ws.name}: first ${result.first.ms.median} ms vs tar|zstd ${result.tarZstd.ms.median} + PutObject ${result.putObjectMs.median}` +
          (result.resticFirst ? ` vs restic ${result.resticFirst.ms.median}` : '') +
          `; cross-host restore ${result.crossHostRestoreMs.median} ms vs GetObject ${result.getObjectMs.median} + untar ${result.untarMs.median}` +
          (result.resticRestoreMs ? ` vs restic ${result.resticRestoreMs.median}` : '') +
          `; ${result.incremental.map((i) => `${i.change}: ${i.stasis.ms.median} ms ${i.stasis.bytes} B${i.restic ? ` (restic ${i.restic.ms.median} ms ${i.restic.bytes} B)` : ''}`).join('; ')}` +
          (errors.length ? `; errors: ${errors[0]}` : ''),
      );
      results.push(result);
    }
  } finally {
    s3.destroy();
    await a.close();
    await b.close();
  }
  return { results, restic: restic !== undefined };
}
