// Worker-side diagnostics (docs/SURFACES.md, Metrics): failures, retries and release
// latency, counted where the provider calls happen.

export class WorkerMetrics {
  failures = 0;
  retries = 0;
  private latencies: number[] = [];

  recordAttempt(attempt: number): void {
    if (attempt > 1) this.retries += 1;
  }

  recordFailure(): void {
    this.failures += 1;
  }

  recordReleaseLatency(ms: number): void {
    this.latencies.push(ms);
    // Keep a bounded window: percentiles over the most recent releases.
    if (this.latencies.length > 10_000) this.latencies.splice(0, this.latencies.length - 10_000);
  }

  snapshot(): { failures: number; retries: number; releaseLatencyMs: number[] } {
    return { failures: this.failures, retries: this.retries, releaseLatencyMs: [...this.latencies] };
  }
}

export function percentiles(samples: number[]): { count: number; p50: number; p95: number; max: number } {
  if (samples.length === 0) return { count: 0, p50: 0, p95: 0, max: 0 };
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
  return { count: sorted.length, p50: at(0.5), p95: at(0.95), max: sorted[sorted.length - 1] };
}
