import { hostPathPolicy, type Config } from '../common/config';
import type { TemporalConnectionOptions } from '../common/temporal-connection';
import type { FiguresStore } from '../stores/figures';
import type { StasisClientOptions } from './index';

/**
 * The typed client's options for a configuration (`loadConfig()`: the environment of README's
 * Configuration), as the CLI, the API and `stasis dev` make them: the Temporal connection and
 * namespace, the task queue, the retention given to new sandboxes, where active workspaces may
 * live, and the workers' figures (failures, retries, release latency) read from the store the
 * workers write them to, so `metricsSnapshot()` reports them.
 */
export function clientOptions(config: Config): StasisClientOptions & { connection: TemporalConnectionOptions } {
  // Loaded on the first snapshot: the S3 client is not needed to start Runs.
  let figures: Promise<FiguresStore> | undefined;
  return {
    connection: config.temporal.connectionOptions,
    namespace: config.TEMPORAL_NAMESPACE,
    namespaceSetting: 'TEMPORAL_NAMESPACE',
    taskQueue: config.STASIS_TASK_QUEUE,
    suspendedRetentionSeconds: config.STASIS_SUSPENDED_RETENTION_SECONDS,
    workerMetrics: async () => {
      figures ??= import('../stores/figures').then(({ createFiguresStore }) => createFiguresStore(config));
      return (await figures).readAll();
    },
    hostPaths: hostPathPolicy(config),
  };
}
