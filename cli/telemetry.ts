import { DefaultLogger, Runtime } from '@temporalio/worker';
import { ConfigError, type Config } from '../common/config';
import type { StasisWorker } from '../workers/worker';
import { serveMetrics, type MetricsServer } from '../workers/metrics-server';

// The Temporal SDK's own worker metrics (task latencies, slots, polls...) on a
// Prometheus endpoint, STASIS_WORKER_METRICS_ADDR (default 127.0.0.1:9464,
// `off` to disable). Must run before the first worker connection is made.

export function installWorkerRuntime(config: Config): string | undefined {
  const addr = config.STASIS_WORKER_METRICS_ADDR;
  try {
    Runtime.install({
      logger: new DefaultLogger('WARN'),
      // The command stops its workers itself, in order with the servers it started.
      shutdownSignals: [],
      ...(addr === 'off' ? {} : { telemetryOptions: { metrics: { prometheus: { bindAddress: addr } } } }),
    });
  } catch (err) {
    throw new ConfigError([
      `STASIS_WORKER_METRICS_ADDR: cannot serve worker metrics on ${addr} (${(err as Error).message}); choose another host:port, or off`,
    ]);
  }
  return addr === 'off' ? undefined : `http://${addr}/metrics`;
}

/** The host's own Prometheus metrics on STASIS_METRICS_ADDR, unless `off`. */
export async function serveHostMetrics(config: Config, worker: StasisWorker): Promise<MetricsServer | undefined> {
  const addr = config.STASIS_METRICS_ADDR;
  if (addr === 'off') return undefined;
  try {
    return await serveMetrics(worker.metrics.registry, addr);
  } catch (err) {
    throw new ConfigError([
      `STASIS_METRICS_ADDR: cannot serve host metrics on ${addr} (${(err as Error).message}); choose another host:port, or off`,
    ]);
  }
}
