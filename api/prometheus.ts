import type { MetricsSnapshot } from '../common/schemas';

// The metrics snapshot in the Prometheus text exposition format (version 0.0.4).
// Written by hand: a few figures of one snapshot need no client library.

type Figure = { name: string; type: 'gauge' | 'counter'; help: string; value: (s: MetricsSnapshot) => number };

const FIGURES: Figure[] = [
  {
    name: 'stasis_active',
    type: 'gauge',
    help: 'Resource records holding live compute (ACTIVE)',
    value: (s) => s.active,
  },
  {
    name: 'stasis_retained',
    type: 'gauge',
    help: 'Records that kept their sandbox while suspended (RETAINED)',
    value: (s) => s.retained,
  },
  {
    name: 'stasis_pending_cleanup',
    type: 'gauge',
    help: 'Records whose release is in flight (RELEASING)',
    value: (s) => s.pendingCleanup,
  },
  {
    name: 'stasis_release_blocked',
    type: 'gauge',
    help: 'Records whose release waits on jobs or children (RELEASE_BLOCKED)',
    value: (s) => s.releaseBlocked,
  },
  {
    name: 'stasis_oldest_blocked_age_seconds',
    type: 'gauge',
    help: 'Age of the oldest RELEASE_BLOCKED record',
    value: (s) => s.oldestBlockedAgeSeconds,
  },
  {
    name: 'stasis_provider_failures_total',
    type: 'counter',
    help: 'Failed provider calls, summed over workers',
    value: (s) => s.failures,
  },
  {
    name: 'stasis_provider_retries_total',
    type: 'counter',
    help: 'Retried provider calls, summed over workers',
    value: (s) => s.retries,
  },
  // Percentiles the workers computed over their recent releases.
  {
    name: 'stasis_release_latency_samples',
    type: 'gauge',
    help: 'Releases the latency figures cover',
    value: (s) => s.releaseLatencyMs.count,
  },
  {
    name: 'stasis_release_latency_p50_ms',
    type: 'gauge',
    help: 'Median release latency (ms)',
    value: (s) => s.releaseLatencyMs.p50,
  },
  {
    name: 'stasis_release_latency_p95_ms',
    type: 'gauge',
    help: '95th percentile release latency (ms)',
    value: (s) => s.releaseLatencyMs.p95,
  },
  {
    name: 'stasis_release_latency_max_ms',
    type: 'gauge',
    help: 'Longest release latency (ms)',
    value: (s) => s.releaseLatencyMs.max,
  },
];

export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

export function prometheusText(snapshot: MetricsSnapshot): string {
  return FIGURES.map(
    (f) => `# HELP ${f.name} ${f.help}\n# TYPE ${f.name} ${f.type}\n${f.name} ${f.value(snapshot)}\n`,
  ).join('');
}
