import { mkdir, readFile } from 'node:fs/promises';
import * as path from 'node:path';
import { Client } from '@temporalio/client';
import { bundleWorkflowCode, NativeConnection, Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { hostPathPolicy, type Config } from '../common/config';
import { createActivities } from '../activities';
import { WorkerMetrics } from '../activities/metrics';
import type { AgentDriver } from '../drivers/api';
import { scriptedDriver } from '../drivers/scripted';
import type { ProviderModuleExport } from '../providers/api';
import { createDefaultRegistry, type ProviderRegistry } from '../providers/registry';
import { createCheckpointStore } from '../stores';
import { createFiguresStore } from '../stores/figures';
import type { CheckpointStore } from '../stores/api';
import { reconcileHost, startMaintenance } from './maintenance';

// One Stasis worker per host: the shared task queue (workflows and any-host
// activities) and the host's own queue `<queue>@<hostId>` for the provider
// activities of the sandboxes this host holds.

export interface StasisWorkerOptions {
  config: Config;
  connection?: NativeConnection;
  /** Extra providers given in code; STASIS_PROVIDERS adds more by module path. */
  providers?: ProviderModuleExport[];
  drivers?: AgentDriver[];
  /** A pre-built workflow bundle, so tests with several workers bundle once. */
  workflowBundle?: WorkflowBundleWithSourceMap;
  store?: CheckpointStore;
}

export interface StasisWorker {
  hostId: string;
  registry: ProviderRegistry;
  metrics: WorkerMetrics;
  /** Resolves when both workers have stopped. */
  run(): Promise<void>;
  shutdown(): Promise<void>;
}

let cachedBundle: Promise<WorkflowBundleWithSourceMap> | undefined;

/** The workflow bundle, built once per process. */
export function workflowBundle(): Promise<WorkflowBundleWithSourceMap> {
  cachedBundle ??= bundleWorkflowCode({
    workflowsPath: require.resolve('../workflows'),
    // Evaluated once per V8 context instead of once per workflow (the SDK deep-freezes it): zod
    // holds no per-workflow state, and loading it was a third of a workflow's start-up (BENCHMARKS.md).
    // Not our schemas: zod fills in schema members on first use, which a frozen schema refuses.
    preloadModules: ['zod'],
    logger: quietBundlerLogger,
  });
  return cachedBundle;
}

const quietBundlerLogger = {
  log: () => undefined,
  trace: () => undefined,
  debug: () => undefined,
  info: () => undefined,
  warn: (message: string) => console.warn(message),
  error: (message: string) => console.error(message),
};

export async function createStasisWorker(options: StasisWorkerOptions): Promise<StasisWorker> {
  const { config } = options;
  const hostId = config.STASIS_HOST_ID;
  const dataDir = path.join(config.STASIS_DATA_DIR, 'hosts', hostId);
  await mkdir(dataDir, { recursive: true });
  const store = options.store ?? createCheckpointStore(config);
  // Validates every provider now: a v2 provider stops the start with its name.
  const registry = createDefaultRegistry({ hostId, dataDir, store }, (config.STASIS_PROVIDERS ?? '').split(',').filter(Boolean));
  for (const provider of options.providers ?? []) registry.register(provider, 'given in code');
  const metrics = await WorkerMetrics.load(hostId, createFiguresStore(config));
  const drivers = new Map<string, AgentDriver>([[scriptedDriver.name, scriptedDriver], ...(options.drivers ?? []).map((d) => [d.name, d] as const)]);
  const activities = createActivities({
    hostId,
    provider: (name) => registry.get(name),
    metrics,
    drivers,
    store,
    hostPaths: hostPathPolicy(config),
  });

  const ownConnection = options.connection === undefined;
  const connection = options.connection ?? (await NativeConnection.connect(config.temporal.connectionOptions));
  const bundle =
    options.workflowBundle ??
    (config.STASIS_WORKFLOW_BUNDLE
      ? (JSON.parse(await readFile(config.STASIS_WORKFLOW_BUNDLE, 'utf8')) as WorkflowBundleWithSourceMap)
      : await workflowBundle());
  const shared = await Worker.create({
    connection,
    namespace: config.TEMPORAL_NAMESPACE,
    taskQueue: config.STASIS_TASK_QUEUE,
    workflowBundle: bundle,
    activities,
    identity: `stasis@${hostId}`,
    // Cancellation reaches an activity with its next heartbeat: keep that prompt.
    maxHeartbeatThrottleInterval: '1s',
  });
  const host = await Worker.create({
    connection,
    namespace: config.TEMPORAL_NAMESPACE,
    taskQueue: `${config.STASIS_TASK_QUEUE}@${hostId}`,
    activities,
    identity: `stasis@${hostId}`,
    maxHeartbeatThrottleInterval: '1s',
  });

  const client = new Client({ connection: await clientConnection(config), namespace: config.TEMPORAL_NAMESPACE });
  const stopMaintenance = startMaintenance({ config, dataDir, registry, client, hostId, store });

  let running: Promise<void> | undefined;
  return {
    hostId,
    registry,
    metrics,
    run() {
      running ??= (async () => {
        await reconcileHost({ registry, client, hostId }).catch((err: unknown) => console.warn(`reconcile failed: ${String(err)}`));
        try {
          await Promise.all([shared.run(), host.run()]);
        } finally {
          stopMaintenance();
          await metrics.flushed();
          await client.connection.close();
          await registry.closeAll();
          if (ownConnection) await connection.close();
        }
      })();
      return running;
    },
    async shutdown() {
      for (const w of [shared, host]) if (w.getState() === 'RUNNING') w.shutdown();
      await running;
    },
  };
}

async function clientConnection(config: Config) {
  const { Connection } = await import('@temporalio/client');
  return Connection.connect(config.temporal.connectionOptions);
}
