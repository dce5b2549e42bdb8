import { randomBytes } from 'node:crypto';
import * as path from 'node:path';
import type { Command } from 'commander';
import { StasisClient } from '../../client';
import { loadConfig } from '../../common/config';
import { ensureBinary } from '../../platform/binaries';
import { portAnswers } from '../../platform/ports';
import { clientOptions } from '../../client/options';
import type { CliContext } from '../context';
import { withProgress } from '../progress';
import { untilStopSignal } from '../signals';

// `stasis dev`: everything on one machine. The Temporal dev server (7233, Web
// UI 8233; or TEMPORAL_ADDRESS / a temporal.toml profile), MinIO (or
// STASIS_S3_ENDPOINT; the fs store only with STASIS_SNAPSHOT_STORE=fs), a worker, and the API with the approval page. Stops them all, in
// reverse order, on Ctrl-C or SIGTERM. Servers, worker SDK and fastify are
// loaded only here, so the one-shot commands start fast.

interface Store {
  /** Variables the worker's configuration gets. */
  env: Record<string, string>;
  description: string;
}

/**
 * The same checkpoint path as production: S3, from STASIS_S3_ENDPOINT or a MinIO
 * started here (built on the first start, like the Temporal CLI). The fs store
 * only when STASIS_SNAPSHOT_STORE=fs asks for it.
 */
async function startStore(ctx: CliContext, dataDir: string, stops: (() => Promise<void>)[]): Promise<Store> {
  const env = ctx.io.env;
  if (ctx.config().STASIS_SNAPSHOT_STORE === 'fs') {
    return { env: {}, description: `fs store in ${path.join(ctx.config().STASIS_DATA_DIR, 'checkpoints-store')}` };
  }
  // A first run builds MinIO (minutes); its own progress lines, before the spinner.
  if (!env.STASIS_S3_ENDPOINT) await ensureBinary('minio', { env });
  const { startMinio } = await import('../../platform/servers');
  const minio = await withProgress(ctx, 'starting MinIO', startMinio({ dataDir, port: 9000, consolePort: 9001, env }));
  stops.push(() => minio.stop());
  return {
    env: {
      STASIS_S3_ENDPOINT: minio.endpoint,
      STASIS_S3_BUCKET: minio.bucket,
      STASIS_S3_REGION: minio.region,
      ...(minio.accessKeyId && minio.secretAccessKey
        ? { AWS_ACCESS_KEY_ID: minio.accessKeyId, AWS_SECRET_ACCESS_KEY: minio.secretAccessKey }
        : {}),
    },
    description: `S3 at ${minio.endpoint} (bucket ${minio.bucket})`,
  };
}

export function devCommand(program: Command, begin: (cmd: Command) => CliContext): void {
  program
    .command('dev')
    .description('run everything on this machine: Temporal dev server, object store, worker, API and approval page')
    .action(async (_opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const base = ctx.config();
      const stops: (() => Promise<void>)[] = [];
      const { installWorkerRuntime, serveHostMetrics } = await import('../telemetry');
      const { startTemporal } = await import('../../platform/servers');
      const { createStasisWorker } = await import('../../workers/worker');
      const { startApi } = await import('../../api/server');
      try {
        const workerMetricsUrl = installWorkerRuntime(base);
        const serversDir = path.join(base.STASIS_DATA_DIR, 'servers');
        // A Temporal the environment or a temporal.toml profile names is only waited for (startTemporal).
        const temporalGiven = base.temporal.addressConfigured;
        // A first run builds the Temporal CLI (minutes); its own progress lines, before the spinner.
        if (!temporalGiven && !(await portAnswers('127.0.0.1', 7233)))
          await ensureBinary('temporal', { env: ctx.io.env });
        const temporal = await withProgress(
          ctx,
          temporalGiven
            ? `waiting for Temporal at ${base.temporal.connectionOptions.address}`
            : 'starting the Temporal dev server',
          startTemporal({
            dataDir: serversDir,
            port: 7233,
            uiPort: 8233,
            namespace: base.TEMPORAL_NAMESPACE,
            env: ctx.io.env,
          }),
        );
        stops.push(() => temporal.stop());
        const store = await startStore(ctx, serversDir, stops);
        const config = loadConfig({ ...ctx.io.env, TEMPORAL_ADDRESS: temporal.address, ...store.env });

        const worker = await withProgress(ctx, 'starting the worker', createStasisWorker({ config }));
        const running = worker.run();
        stops.push(async () => {
          await worker.shutdown();
          await running;
        });
        const hostMetrics = await serveHostMetrics(config, worker);
        if (hostMetrics) stops.push(() => hostMetrics.close());
        const client = await StasisClient.connect(clientOptions(config));
        stops.push(() => client.close());

        const configured = config.STASIS_API_TOKENS ?? [];
        // The person who ran `stasis dev` owns this machine: the session's token may do everything.
        const generated =
          configured.length === 0
            ? { name: 'dev', secret: randomBytes(24).toString('base64url'), role: 'admin' as const }
            : undefined;
        const tokens = generated ? [generated] : configured;
        const { app, url } = await startApi({
          client,
          tokens,
          addr: config.STASIS_HTTP_ADDR,
          logger: { level: 'warn', destination: ctx.io.stderr },
        });
        stops.push(() => app.close());

        const summary = {
          temporal: { address: temporal.address, namespace: temporal.namespace, webUrl: temporal.uiUrl ?? null },
          store: store.description,
          worker: {
            hostId: worker.hostId,
            taskQueue: config.STASIS_TASK_QUEUE,
            metricsUrl: workerMetricsUrl ?? null,
            hostMetricsUrl: hostMetrics?.url ?? null,
          },
          apiUrl: `${url}/api/v1`,
          pageUrl: `${url}/`,
          signInUrl: generated ? `${url}/?token=${generated.secret}` : null,
        };
        ctx.print(
          summary,
          [
            'stasis dev is running',
            `  Temporal        ${temporal.address} (namespace ${temporal.namespace})`,
            `  Temporal Web    ${temporal.uiUrl ?? 'not started here (TEMPORAL_ADDRESS is set)'}`,
            `  Checkpoints     ${store.description}`,
            `  Worker          host ${worker.hostId}, task queue ${config.STASIS_TASK_QUEUE}`,
            ...(hostMetrics ? [`  Host metrics    ${hostMetrics.url}`] : []),
            ...(workerMetricsUrl ? [`  SDK metrics     ${workerMetricsUrl}`] : []),
            `  API             ${url}/api/v1   (OpenAPI ${url}/api/openapi.json)`,
            `  Approval page   ${url}/`,
            generated
              ? `  Sign in         ${url}/?token=${generated.secret}\n                  (an admin token generated for this session; set STASIS_API_TOKENS=name:secret[:role] to choose your own)`
              : `  Sign in         with a secret of STASIS_API_TOKENS`,
            'Press Ctrl-C to stop.',
          ].join('\n'),
        );
        // A worker that dies stops the whole stack rather than leaving a deaf API.
        await Promise.race([untilStopSignal(), running]);
      } finally {
        for (const stop of stops.reverse()) {
          await stop().catch((err: unknown) => ctx.note(`stasis: while stopping: ${String(err)}`));
        }
      }
    });
}
