import { mkdir, readFile } from 'node:fs/promises';
import * as path from 'node:path';
import { Client } from '@temporalio/client';
import { bundleWorkflowCode, NativeConnection, Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { checkNamespace, ConfigError, hostPathPolicy, webhookTarget, type Config } from '../common/config';
import { sweepExternalJobs } from '../providers/external-jobs';
import { createActivities } from '../activities';
import { WorkerMetrics } from '../activities/metrics';
import type { AgentDriver } from '../drivers/api';
import type { ProviderModuleExport } from '../providers/api';
import { createDefaultRegistry, type ProviderRegistry } from '../providers/registry';
import { createCheckpointStore } from '../stores';
import { createFiguresStore } from '../stores/figures';
import type { CheckpointStore } from '../stores/api';
import { loadDrivers, modulePathList } from './drivers';
import { reconcileHost, startMaintenance } from './maintenance';

// One Stasis worker per host: the shared task queue (workflows and any-host
// activities) and the host's own queue `<queue>@<hostId>` for the provider
// activities of the sandboxes this host holds.

export interface StasisWorkerOptions {
  config: Config;
  connection?: NativeConnection;
  /** Extra providers given in code; STASIS_PROVIDERS adds more by module path. */
  providers?: ProviderModuleExport[];
  /** Extra agent drivers given in code (`scripted` is built in); STASIS_DRIVERS adds more by module path. */
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
  /** Runs and sandboxes held in the workflow cache now (at most STASIS_MAX_CACHED_WORKFLOWS). */
  cachedWorkflows(): number;
  shutdown(): Promise<void>;
}

let cachedBundle: Promise<WorkflowBundleWithSourceMap> | undefined;

/** The workflow bundle, built once per process. */
export function workflowBundle(): Promise<WorkflowBundleWithSourceMap> {
  cachedBundle ??= bundleWorkflowCode({
    // Workflow code loads no zod (common/wire-checks validates there): every Run's context would
    // build the schemas again (BENCHMARKS.md). test/workers/workflow-bundle.test.ts keeps it out.
    workflowsPath: require.resolve('../workflows'),
    // Merges the search-attribute upserts of an activation (workflows/visibility.ts, PATCH_ONE_UPSERT):
    // every bundle that runs or replays Stasis workflows must carry it.
    workflowInterceptorModules: [require.resolve('../workflows/upsert-merge')],
    // Loaded once per workflow thread and shared (frozen) by every workflow in it, instead of once per
    // workflow: instantiating Stasis's modules cost each cached Run ~120 KiB of heap (BENCHMARKS.md).
    // Safe only because these modules hold no state of their own (test/workers/workflow-bundle.test.ts).
    preloadModules: [require.resolve('../workflows'), require.resolve('../workflows/upsert-merge')],
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

/**
 * The prebuilt workflow bundle STASIS_WORKFLOW_BUNDLE names (bundleWorkflowCode's result, as JSON);
 * a ConfigError naming the variable when it cannot be read or is not one.
 */
export async function readWorkflowBundle(file: string): Promise<WorkflowBundleWithSourceMap> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new ConfigError([`STASIS_WORKFLOW_BUNDLE: cannot read ${file} (${(err as NodeJS.ErrnoException).code})`]);
  }
  let bundle: unknown;
  try {
    bundle = JSON.parse(text);
  } catch {
    bundle = undefined;
  }
  const { code, sourceMap } = (bundle ?? {}) as Partial<Record<string, unknown>>;
  if (typeof code !== 'string' || code === '' || (sourceMap !== undefined && typeof sourceMap !== 'string'))
    throw new ConfigError([
      `STASIS_WORKFLOW_BUNDLE: ${file} is not a workflow bundle (JSON of bundleWorkflowCode's result: { "code": ... })`,
    ]);
  return bundle as WorkflowBundleWithSourceMap;
}

export async function createStasisWorker(options: StasisWorkerOptions): Promise<StasisWorker> {
  const { config } = options;
  // Read before anything starts: a bad file is a configuration error at once.
  const givenBundle =
    options.workflowBundle ??
    (config.STASIS_WORKFLOW_BUNDLE ? await readWorkflowBundle(config.STASIS_WORKFLOW_BUNDLE) : undefined);
  // Validates every driver now: a bad module stops the start with its path.
  const drivers = loadDrivers(options.drivers ?? [], modulePathList(config.STASIS_DRIVERS));
  const hostId = config.STASIS_HOST_ID;
  const dataDir = path.join(config.STASIS_DATA_DIR, 'hosts', hostId);
  await mkdir(dataDir, { recursive: true });
  const store = options.store ?? createCheckpointStore(config);
  // Validates every provider now: a v2 provider stops the start with its name.
  const registry = createDefaultRegistry(
    { hostId, dataDir, store, volumes: config.STASIS_SANDBOX_VOLUMES },
    modulePathList(config.STASIS_PROVIDERS),
  );
  for (const provider of options.providers ?? []) registry.register(provider, 'given in code');
  const metrics = await WorkerMetrics.load(hostId, createFiguresStore(config));
  await sweepExternalJobs({ hostId, dataDir });
  const activities = createActivities({
    hostId,
    provider: (name) => registry.get(name),
    metrics,
    drivers,
    store,
    dataDir,
    hostPaths: hostPathPolicy(config),
    webhook: webhookTarget(config),
  });

  const ownConnection = options.connection === undefined;
  const connection = options.connection ?? (await NativeConnection.connect(config.temporal.connectionOptions));
  try {
    await checkNamespace(
      connection.workflowService,
      config.TEMPORAL_NAMESPACE,
      config.temporal.connectionOptions.address,
    );
  } catch (err) {
    if (ownConnection) await connection.close();
    throw err;
  }
  const bundle = givenBundle ?? (await workflowBundle());
  const shared = await Worker.create({
    connection,
    namespace: config.TEMPORAL_NAMESPACE,
    taskQueue: config.STASIS_TASK_QUEUE,
    workflowBundle: bundle,
    activities,
    identity: `stasis@${hostId}`,
    // Cancellation reaches an activity with its next heartbeat: keep that prompt.
    maxHeartbeatThrottleInterval: '1s',
    // Waiting Runs need no cache slot: one evicted replays its history when answered (BENCHMARKS.md).
    maxCachedWorkflows: config.STASIS_MAX_CACHED_WORKFLOWS,
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
  // A shutdown asked for before the workers run (run() reconciles first) stops them as they start:
  // a worker still INITIALIZED cannot be shut down, and would otherwise poll on forever.
  let stopRequested = false;
  const stopWorkers = () => {
    for (const w of [shared, host]) if (w.getState() === 'RUNNING') w.shutdown();
  };
  return {
    hostId,
    registry,
    metrics,
    run() {
      running ??= (async () => {
        await reconcileHost({ registry, client, hostId, taskQueue: config.STASIS_TASK_QUEUE }).catch((err: unknown) =>
          console.warn(`reconcile failed: ${String(err)}`),
        );
        try {
          const both = Promise.all([shared.run(), host.run()]);
          if (stopRequested) stopWorkers();
          await both;
        } finally {
          await stopMaintenance();
          await metrics.flushed();
          await client.connection.close();
          await registry.closeAll();
          if (ownConnection) await connection.close();
        }
      })();
      return running;
    },
    cachedWorkflows: () => shared.getStatus().numCachedWorkflows,
    async shutdown() {
      stopRequested = true;
      stopWorkers();
      await running;
    },
  };
}

async function clientConnection(config: Config) {
  const { Connection } = await import('@temporalio/client');
  return Connection.connect(config.temporal.connectionOptions);
}
