import type { Client } from '@temporalio/client';
import type { MetricsSnapshot } from '../common/schemas';
import { percentiles } from '../common/percentiles';
import type { HostFigures } from '../stores/figures';
import { StasisBlockedSince } from '../workflows/search-attributes';

// The metrics snapshot. Counts come from Temporal visibility over the Stasis
// search attributes; failures, retries and release latency from the figures
// every host writes durably beside the checkpoints (stores/figures.ts), so the
// snapshot covers every host, including hosts that died or restarted.

export type WorkerMetricsSource = () => Promise<HostFigures[]>;

/**
 * The snapshot of the Runs and sandboxes of `taskQueue` (a name QUEUE_NAME allows: it goes into the
 * query as it is), as their lists are: another deployment in the namespace has its own queue.
 */
export async function collectMetrics(
  temporal: Client,
  taskQueue: string,
  source?: WorkerMetricsSource,
): Promise<MetricsSnapshot> {
  const running = (clause: string) => `ExecutionStatus = 'Running' AND TaskQueue = '${taskQueue}' AND ${clause}`;
  const count = async (state: string) =>
    (await temporal.workflow.count(running(`StasisResourceState = '${state}'`))).count;
  const [active, retained, pendingCleanup, releaseBlocked] = await Promise.all([
    count('ACTIVE'),
    count('RETAINED'),
    count('RELEASING'),
    count('RELEASE_BLOCKED'),
  ]);
  let oldestBlockedMs: number | undefined;
  for await (const wf of temporal.workflow.list({ query: running(`StasisResourceState = 'RELEASE_BLOCKED'`) })) {
    const since = wf.typedSearchAttributes.get(StasisBlockedSince);
    if (since && (oldestBlockedMs === undefined || since.getTime() < oldestBlockedMs))
      oldestBlockedMs = since.getTime();
  }
  const hosts = source ? await source() : [];
  const latency = percentiles(hosts.flatMap((h) => h.releaseLatencyMs));
  return {
    active,
    retained,
    pendingCleanup,
    releaseBlocked,
    failures: hosts.reduce((n, h) => n + h.failures, 0),
    retries: hosts.reduce((n, h) => n + h.retries, 0),
    oldestBlockedAgeSeconds:
      oldestBlockedMs === undefined ? 0 : Math.max(0, Math.round((Date.now() - oldestBlockedMs) / 1000)),
    // Every confirmed release counts; the percentiles cover each host's most recent ones.
    releaseLatencyMs: { ...latency, count: hosts.reduce((n, h) => n + h.releases, 0) },
  };
}
