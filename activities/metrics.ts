import { Counter, Histogram, Registry } from 'prom-client';
import type { FiguresStore, HostFigures } from '../stores/figures';

// Worker-side diagnostics, counted where the provider calls happen, two ways:
// - Prometheus metrics of this host (prom-client; counters, and histograms in
//   seconds), scraped per host and aggregated by Prometheus;
// - the host's durable figures (stores/figures.ts), which the metrics snapshot
//   sums over every host, dead or alive, and which survive a restart.

/** Recent release latencies kept per host for the snapshot's percentiles. */
const LATENCY_WINDOW = 1_000;

/** Release latencies from seconds to the 10-minute release timeout. */
const RELEASE_BUCKETS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];

export class WorkerMetrics {
  /** This host's Prometheus registry (the worker serves it on STASIS_METRICS_ADDR). */
  readonly registry = new Registry();
  private figures: HostFigures;
  private readonly failuresTotal: Counter;
  private readonly retriesTotal: Counter;
  private readonly releaseDuration: Histogram;
  /** The write chain: one write at a time, the latest figures last. */
  private writing: Promise<void> = Promise.resolve();
  private dirty = false;

  /** False while the host's earlier figures are still to be read from the store. */
  private loaded: boolean;

  /** `previous`: the host's earlier figures, `null` when it has none; omitted: not read yet. */
  constructor(
    readonly hostId: string,
    private readonly store?: FiguresStore,
    previous?: HostFigures | null,
  ) {
    this.loaded = store === undefined || previous !== undefined;
    this.figures = previous ?? {
      hostId,
      failures: 0,
      retries: 0,
      releases: 0,
      releaseLatencyMs: [],
      updatedAt: new Date(0).toISOString(),
    };
    this.registry.setDefaultLabels({ host: hostId });
    this.failuresTotal = new Counter({
      name: 'stasis_provider_failures_total',
      help: 'Provider calls of this host that failed (each attempt counts)',
      registers: [this.registry],
    });
    this.retriesTotal = new Counter({
      name: 'stasis_provider_retries_total',
      help: 'Provider calls of this host that were retries (attempt > 1)',
      registers: [this.registry],
    });
    this.releaseDuration = new Histogram({
      name: 'stasis_release_duration_seconds',
      help: 'From a release being scheduled to its confirmed receipt, on this host',
      buckets: RELEASE_BUCKETS,
      registers: [this.registry],
    });
  }

  /**
   * Carries on from the figures the host wrote before (a restart). When they cannot be
   * read now (the store is down), nothing is written until they can be: a write
   * from zero would erase them.
   */
  static async load(hostId: string, store: FiguresStore): Promise<WorkerMetrics> {
    try {
      return new WorkerMetrics(hostId, store, (await store.read(hostId)) ?? null);
    } catch (err) {
      console.warn(
        `could not read the metrics figures of host ${hostId} (${String(err)}); reading them again before the first write`,
      );
      return new WorkerMetrics(hostId, store);
    }
  }

  recordAttempt(attempt: number): void {
    if (attempt <= 1) return;
    this.retriesTotal.inc();
    this.figures.retries += 1;
    void this.persist();
  }

  recordFailure(): void {
    this.failuresTotal.inc();
    this.figures.failures += 1;
    void this.persist();
  }

  /**
   * Counts the release at once (the Prometheus registry and the snapshot); resolves once it is in the
   * durable figures (or their write failed, which is logged). Never rejects, so a release need not wait.
   */
  recordReleaseLatency(ms: number): Promise<void> {
    this.releaseDuration.observe(ms / 1000);
    this.figures.releases += 1;
    const latencies = this.figures.releaseLatencyMs;
    latencies.push(ms);
    if (latencies.length > LATENCY_WINDOW) latencies.splice(0, latencies.length - LATENCY_WINDOW);
    return this.persist();
  }

  snapshot(): HostFigures {
    return { ...this.figures, releaseLatencyMs: [...this.figures.releaseLatencyMs] };
  }

  /** Waits for every write that was asked for so far. */
  flushed(): Promise<void> {
    return this.writing;
  }

  /**
   * Queues a write of the current figures. Writes that pile up behind a slow one
   * collapse into one; a failed write is logged and retried with the next change
   * (diagnostics never fail a provider call).
   */
  private persist(): Promise<void> {
    if (!this.store) return Promise.resolve();
    const store = this.store;
    this.dirty = true;
    this.writing = this.writing.then(async () => {
      if (!this.dirty) return;
      if (!this.loaded) {
        const earlier = await store.read(this.hostId).catch(() => 'unreadable' as const);
        if (earlier === 'unreadable') return;
        if (earlier) this.figures = addFigures(earlier, this.figures);
        this.loaded = true;
      }
      this.dirty = false;
      this.figures.updatedAt = new Date().toISOString();
      try {
        await store.write(this.snapshot());
      } catch (err) {
        this.dirty = true;
        console.warn(`could not write the metrics figures of host ${this.hostId}: ${String(err)}`);
      }
    });
    return this.writing;
  }
}

function addFigures(earlier: HostFigures, now: HostFigures): HostFigures {
  return {
    hostId: now.hostId,
    failures: earlier.failures + now.failures,
    retries: earlier.retries + now.retries,
    releases: earlier.releases + now.releases,
    releaseLatencyMs: [...earlier.releaseLatencyMs, ...now.releaseLatencyMs].slice(-LATENCY_WINDOW),
    updatedAt: now.updatedAt,
  };
}
