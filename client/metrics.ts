import { readdir, readFile } from 'node:fs/promises';
import * as path from 'node:path';
import type { Client } from '@temporalio/client';
import type { MetricsSnapshot } from '../common/schemas';
import { percentiles } from '../activities/metrics';
import { StasisBlockedSince } from '../workflows/search-attributes';

// The metrics snapshot (docs/SURFACES.md). Counts come from Temporal visibility
// over the Stasis search attributes, so they hold across workers; failures,
// retries and release latency come from the workers themselves.

export interface WorkerMetricsFigures {
  failures: number;
  retries: number;
  releaseLatencyMs: number[];
}

export type WorkerMetricsSource = () => Promise<WorkerMetricsFigures[]>;

/** Workers write their figures to `<dataDir>/metrics/<hostId>.json`; this reads them all. */
export function fileMetricsSource(dataDir: string): WorkerMetricsSource {
  const dir = path.join(dataDir, 'metrics');
  return async () => {
    const files = await readdir(dir).catch(() => [] as string[]);
    const figures = await Promise.all(
      files
        .filter((f) => f.endsWith('.json'))
        .map((f) =>
          readFile(path.join(dir, f), 'utf8')
            .then((text) => JSON.parse(text) as WorkerMetricsFigures)
            .catch(() => undefined),
        ),
    );
    return figures.filter((f): f is WorkerMetricsFigures => f !== undefined);
  };
}

const running = (clause: string) => `ExecutionStatus = 'Running' AND ${clause}`;

export async function collectMetrics(temporal: Client, source?: WorkerMetricsSource): Promise<MetricsSnapshot> {
  const count = async (state: string) => (await temporal.workflow.count(running(`StasisResourceState = '${state}'`))).count;
  const [active, retained, pendingCleanup, releaseBlocked] = await Promise.all([
    count('ACTIVE'),
    count('RETAINED'),
    count('RELEASING'),
    count('RELEASE_BLOCKED'),
  ]);
  let oldestBlockedMs: number | undefined;
  for await (const wf of temporal.workflow.list({ query: running(`StasisResourceState = 'RELEASE_BLOCKED'`) })) {
    const since = wf.typedSearchAttributes.get(StasisBlockedSince);
    if (since && (oldestBlockedMs === undefined || since.getTime() < oldestBlockedMs)) oldestBlockedMs = since.getTime();
  }
  const workers = source ? await source() : [];
  return {
    active,
    retained,
    pendingCleanup,
    releaseBlocked,
    failures: workers.reduce((n, w) => n + w.failures, 0),
    retries: workers.reduce((n, w) => n + w.retries, 0),
    oldestBlockedAgeSeconds: oldestBlockedMs === undefined ? 0 : Math.max(0, Math.round((Date.now() - oldestBlockedMs) / 1000)),
    releaseLatencyMs: percentiles(workers.flatMap((w) => w.releaseLatencyMs)),
  };
}
