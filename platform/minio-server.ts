import * as fs from 'node:fs';
import * as path from 'node:path';
import { CreateBucketCommand, HeadBucketCommand, S3Client } from '@aws-sdk/client-s3';
import { ensureBinary } from './binaries';
import { isAlive, spawnGroup, stopGroup } from './process-group';
import { logTail, PermanentError, retryUntil } from './wait';

// A local MinIO as the S3 checkpoint store for `stasis dev` and tests, or the
// S3 endpoint in STASIS_S3_ENDPOINT. Either way the checkpoints bucket exists
// when startMinio resolves.

export interface MinioOptions {
  /** MinIO's data goes to `<dataDir>/minio`, its log to `<dataDir>/logs/minio.log`. */
  dataDir: string;
  /** S3 API port; 9000 by default. */
  port?: number;
  /** Console port; 9001 by default. */
  consolePort?: number;
  /** Default STASIS_S3_BUCKET or `stasis`. */
  bucket?: string;
  /** Where STASIS_S3_ENDPOINT, MINIO_ROOT_USER/PASSWORD and the binary cache settings are read. */
  env?: NodeJS.ProcessEnv;
  /** Keeps pid, port and data dir here, so another process can stop and start this MinIO. */
  stateFile?: string;
  startTimeoutMs?: number;
}

export interface MinioServer {
  /** http://host:port */
  endpoint: string;
  bucket: string;
  region: string;
  accessKeyId: string | undefined;
  secretAccessKey: string | undefined;
  /** True when this call started MinIO; only then do stop/start/restart act. */
  started: boolean;
  logFile: string | undefined;
  /** Stops the server (SIGTERM, then SIGKILL). The data dir stays. */
  stop(): Promise<void>;
  /** Starts it again on the same port and data dir, and waits until it serves. */
  start(): Promise<void>;
  restart(): Promise<void>;
}

/** What another process needs to stop and restart a MinIO we started (see minioFromState). */
export interface MinioState {
  pid: number | undefined;
  binary: string;
  port: number;
  consolePort: number;
  dataDir: string;
  logFile: string;
  bucket: string;
  region: string;
  accessKeyId: string;
  secretAccessKey: string;
}

export async function startMinio(options: MinioOptions): Promise<MinioServer> {
  const env = options.env ?? process.env;
  const bucket = options.bucket ?? env.STASIS_S3_BUCKET ?? 'stasis';
  const region = env.STASIS_S3_REGION ?? 'us-east-1';
  const timeoutMs = options.startTimeoutMs ?? 60_000;

  if (env.STASIS_S3_ENDPOINT) {
    const server = external(env.STASIS_S3_ENDPOINT, bucket, region, env.AWS_ACCESS_KEY_ID, env.AWS_SECRET_ACCESS_KEY);
    await retryUntil(`S3 bucket ${bucket} at ${server.endpoint}`, 30_000, undefined, () => ensureBucket(server));
    return server;
  }

  const port = options.port ?? 9000;
  const accessKeyId = env.MINIO_ROOT_USER ?? 'stasis';
  const secretAccessKey = env.MINIO_ROOT_PASSWORD ?? 'stasis-secret';
  const endpoint = `http://127.0.0.1:${port}`;
  if (await healthy(endpoint)) {
    // A MinIO left running on this port (e.g. by a previous `stasis dev`): use it, do not own it.
    const server = external(endpoint, bucket, region, accessKeyId, secretAccessKey);
    await retryUntil(`S3 bucket ${bucket} at ${endpoint}`, 30_000, undefined, () => ensureBucket(server));
    return server;
  }

  const minio = new MinioProcess(
    {
      pid: undefined,
      binary: await ensureBinary('minio', { env }),
      port,
      consolePort: options.consolePort ?? 9001,
      dataDir: options.dataDir,
      logFile: path.join(options.dataDir, 'logs', 'minio.log'),
      bucket,
      region,
      accessKeyId,
      secretAccessKey,
    },
    { owned: true, stateFile: options.stateFile, env, timeoutMs },
  );
  await minio.start();
  return {
    endpoint,
    bucket,
    region,
    accessKeyId,
    secretAccessKey,
    started: true,
    logFile: minio.state.logFile,
    stop: () => minio.stop(),
    start: () => minio.start(),
    restart: () => minio.restart(),
  };
}

/**
 * Control of a MinIO started by another process of the same machine, from the
 * state file it wrote. A MinIO started here is not tied to this process's
 * lifetime: its original owner stops it (it reads the pid from the file).
 */
export function minioFromState(stateFile: string, env: NodeJS.ProcessEnv = process.env): MinioServerControl {
  const state = JSON.parse(fs.readFileSync(stateFile, 'utf8')) as MinioState;
  return new MinioProcess(state, { owned: false, stateFile, env, timeoutMs: 60_000 });
}

export interface MinioServerControl {
  readonly state: MinioState;
  stop(): Promise<void>;
  start(): Promise<void>;
  restart(): Promise<void>;
}

class MinioProcess implements MinioServerControl {
  constructor(
    public state: MinioState,
    private readonly options: {
      owned: boolean;
      stateFile: string | undefined;
      env: NodeJS.ProcessEnv;
      timeoutMs: number;
    },
  ) {}

  private get endpoint(): string {
    return `http://127.0.0.1:${this.state.port}`;
  }

  /** With a state file, the file is the truth: another process may have restarted MinIO. */
  private refresh(): void {
    if (this.options.stateFile && fs.existsSync(this.options.stateFile)) {
      this.state = JSON.parse(fs.readFileSync(this.options.stateFile, 'utf8')) as MinioState;
    }
  }

  private save(): void {
    if (this.options.stateFile) {
      const tmp = `${this.options.stateFile}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, JSON.stringify(this.state, null, 2));
      fs.renameSync(tmp, this.options.stateFile);
    }
  }

  async start(): Promise<void> {
    this.refresh();
    if (this.state.pid !== undefined && isAlive(this.state.pid)) return;
    const { binary, dataDir, port, consolePort, logFile } = this.state;
    const child = spawnGroup(
      binary,
      [
        'server',
        path.join(dataDir, 'minio'),
        '--address',
        `127.0.0.1:${port}`,
        '--console-address',
        `127.0.0.1:${consolePort}`,
      ],
      {
        env: {
          ...this.options.env,
          MINIO_ROOT_USER: this.state.accessKeyId,
          MINIO_ROOT_PASSWORD: this.state.secretAccessKey,
          MINIO_UPDATE: 'off',
        },
        logFile,
        owned: this.options.owned,
      },
    );
    this.state = { ...this.state, pid: child.pid };
    this.save();
    const gaveUp = (): string | undefined =>
      child.hasExited() ? `minio exited early; log ${logFile}:\n${logTail(logFile)}` : undefined;
    try {
      await retryUntil(`MinIO at ${this.endpoint}`, this.options.timeoutMs, gaveUp, async () => {
        if (!(await healthy(this.endpoint))) throw new Error('/minio/health/live is not answering yet');
        await ensureBucket(this.state);
      });
    } catch (error) {
      await this.stop();
      throw error;
    }
  }

  async stop(): Promise<void> {
    this.refresh();
    if (this.state.pid !== undefined) await stopGroup(this.state.pid);
    this.state = { ...this.state, pid: undefined };
    this.save();
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }
}

function external(
  endpoint: string,
  bucket: string,
  region: string,
  accessKeyId: string | undefined,
  secretAccessKey: string | undefined,
): MinioServer {
  const notOurs = (): Promise<void> =>
    Promise.reject(
      new Error(`the S3 store at ${endpoint} was not started by Stasis; it cannot be started or stopped here`),
    );
  return {
    endpoint: endpoint.replace(/\/+$/, ''),
    bucket,
    region,
    accessKeyId,
    secretAccessKey,
    started: false,
    logFile: undefined,
    stop: async () => {},
    start: notOurs,
    restart: notOurs,
  };
}

async function healthy(endpoint: string): Promise<boolean> {
  try {
    const response = await fetch(`${endpoint}/minio/health/live`, { signal: AbortSignal.timeout(1_000) });
    return response.ok;
  } catch {
    return false;
  }
}

/** HeadBucket, and CreateBucket when it does not exist. */
export async function ensureBucket(target: {
  endpoint?: string;
  port?: number;
  bucket: string;
  region: string;
  accessKeyId: string | undefined;
  secretAccessKey: string | undefined;
}): Promise<void> {
  const client = new S3Client({
    endpoint: target.endpoint ?? `http://127.0.0.1:${target.port}`,
    region: target.region,
    forcePathStyle: true,
    maxAttempts: 1,
    credentials:
      target.accessKeyId && target.secretAccessKey
        ? { accessKeyId: target.accessKeyId, secretAccessKey: target.secretAccessKey }
        : undefined,
  });
  try {
    try {
      await client.send(new HeadBucketCommand({ Bucket: target.bucket }));
      return;
    } catch (error) {
      const status = (error as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
      if (status === 403) {
        throw new PermanentError(
          `access to bucket ${target.bucket} denied: check the credentials (MINIO_ROOT_USER/MINIO_ROOT_PASSWORD, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)`,
        );
      }
      if (status !== 404) throw error;
    }
    try {
      await client.send(new CreateBucketCommand({ Bucket: target.bucket }));
    } catch (error) {
      if ((error as Error).name !== 'BucketAlreadyOwnedByYou') throw error;
    }
  } finally {
    client.destroy();
  }
}
