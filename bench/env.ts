import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { DefaultLogger, NativeConnection, Runtime } from '@temporalio/worker';
import { loadConfig, type Config } from '../common/config';
import { StasisClient } from '../client';
import { clientOptions } from '../client/options';
import { freePorts, startMinio, startTemporal, type MinioServer, type TemporalServer } from '../platform/servers';
import { createCheckpointStore } from '../stores';
import type { CheckpointStore } from '../stores/api';
import { createStasisWorker, type StasisWorker } from '../workers/worker';

// One bench run's world: a Temporal dev server and a MinIO started here (own
// temp data dir, free ports, stopped at the end), one Stasis worker in this
// process, the typed client, and the SDK's Prometheus metrics on a free port.

export interface BenchEnv {
  dataDir: string;
  temporalServer: TemporalServer;
  minio: MinioServer;
  /** MinIO's process, for the CPU it uses. */
  minioPid: number | undefined;
  config: Config;
  client: StasisClient;
  temporal: Client;
  worker: StasisWorker;
  /** The checkpoint store the worker uses (MinIO), for the baselines. */
  store: CheckpointStore;
  sdkMetricsUrl: string;
  /** Where the bench keeps host-persistent workspaces and scratch files. */
  scratch: string;
  stop(): Promise<void>;
}

export const HOST_ID = 'bench-host';

/** `settings`: more worker configuration (STASIS_* variables), for experiments on one setting. */
export async function startEnv(log: (line: string) => void, settings: Record<string, string> = {}): Promise<BenchEnv> {
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'stasis-bench-'));
  const scratch = path.join(dataDir, 'scratch');
  mkdirSync(scratch, { recursive: true });
  const [temporalPort, minioPort, consolePort, metricsPort] = await freePorts(4);
  // Servers of our own, whatever the shell points at.
  const serverEnv: NodeJS.ProcessEnv = { ...process.env };
  for (const key of ['TEMPORAL_ADDRESS', 'STASIS_S3_ENDPOINT', 'MINIO_ROOT_USER', 'MINIO_ROOT_PASSWORD'])
    delete serverEnv[key];
  log(`servers: Temporal dev server on ${temporalPort}, MinIO on ${minioPort}, data ${dataDir}`);
  const [t, m] = await Promise.allSettled([
    startTemporal({ dataDir, port: temporalPort, env: serverEnv }),
    startMinio({ dataDir, port: minioPort, consolePort, env: serverEnv }),
  ]);
  if (t.status === 'rejected' || m.status === 'rejected') {
    if (t.status === 'fulfilled') await t.value.stop();
    if (m.status === 'fulfilled') await m.value.stop();
    throw t.status === 'rejected' ? t.reason : (m as PromiseRejectedResult).reason;
  }
  const temporalServer = t.value;
  const minio = m.value;

  const sdkMetricsAddr = `127.0.0.1:${metricsPort}`;
  Runtime.install({
    logger: new DefaultLogger('WARN'),
    shutdownSignals: [],
    telemetryOptions: { metrics: { prometheus: { bindAddress: sdkMetricsAddr } } },
  });
  const config = loadConfig({
    TEMPORAL_ADDRESS: temporalServer.address,
    TEMPORAL_NAMESPACE: temporalServer.namespace,
    STASIS_TASK_QUEUE: 'bench',
    STASIS_HOST_ID: HOST_ID,
    STASIS_DATA_DIR: path.join(dataDir, 'stasis'),
    STASIS_S3_ENDPOINT: minio.endpoint,
    STASIS_S3_BUCKET: minio.bucket,
    STASIS_S3_REGION: minio.region,
    AWS_ACCESS_KEY_ID: minio.accessKeyId,
    AWS_SECRET_ACCESS_KEY: minio.secretAccessKey,
    STASIS_WORKER_METRICS_ADDR: 'off',
    STASIS_HOST_PATHS: scratch,
    ...settings,
  });
  const store = createCheckpointStore(config);
  const connection = await Connection.connect(config.temporal.connectionOptions);
  const temporal = new Client({ connection, namespace: config.TEMPORAL_NAMESPACE });
  const client = new StasisClient(temporal, clientOptions(config));
  const native = await NativeConnection.connect(config.temporal.connectionOptions);
  const worker = await createStasisWorker({ config, connection: native, store });
  const running = worker.run();

  let stopped = false;
  return {
    dataDir,
    temporalServer,
    minio,
    minioPid: processesMentioning(path.join(dataDir, 'minio'))[0],
    config,
    client,
    temporal,
    worker,
    store,
    sdkMetricsUrl: `http://${sdkMetricsAddr}/metrics`,
    scratch,
    async stop() {
      if (stopped) return;
      stopped = true;
      const errors: unknown[] = [];
      const attempt = async (fn: () => Promise<unknown>) => {
        try {
          await fn();
        } catch (err) {
          errors.push(err);
        }
      };
      await attempt(() => worker.shutdown());
      await attempt(() => running);
      await attempt(() => native.close());
      await attempt(() => connection.close());
      await attempt(() => temporalServer.stop());
      await attempt(() => minio.stop());
      // Sandboxes of Runs the bench left unfinished still have their volumes mounted (sandbox volumes are on
      // where the host allows them): unmounted first, or removing the data dir fails (EBUSY) and leaves them.
      unmountUnder(dataDir);
      rmSync(dataDir, { recursive: true, force: true });
      if (errors.length > 0) log(`stop: ${errors.map(String).join('; ')}`);
    },
  };
}

/** Lazily unmounts every filesystem mounted under `dir` (best effort). */
function unmountUnder(dir: string): void {
  const mounts = readFileSync('/proc/self/mounts', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[1] ?? '')
    .filter((point) => point.startsWith(`${dir}/`))
    .reverse();
  for (const point of mounts) {
    try {
      execFileSync('umount', ['--lazy', point], { stdio: 'ignore' });
    } catch {
      // not ours to unmount, or gone already: the removal below says what is left
    }
  }
}

/** Processes whose command line names `dir` (the servers we started: MinIO's data dir, Temporal's database file). */
export function processesMentioning(dir: string): number[] {
  const found: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'utf8').includes(dir)) found.push(Number(name));
    } catch {
      // gone
    }
  }
  return found;
}
