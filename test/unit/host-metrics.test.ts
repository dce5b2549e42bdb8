import { mkdtempSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import fc from 'fast-check';
import { WorkerMetrics } from '../../activities/metrics';
import { FsFiguresStore, type FiguresStore, type HostFigures } from '../../stores/figures';

// A host's figures are durable: a restarted host counts on from them, a store
// that cannot be read at start never gets overwritten from zero, and the
// Prometheus registry exports the same events per host.

const newStore = () => new FsFiguresStore(mkdtempSync(path.join(os.tmpdir(), 'figures-')));

type Event = { kind: 'retry' } | { kind: 'failure' } | { kind: 'release'; ms: number };
const event = fc.oneof(
  fc.constant<Event>({ kind: 'retry' }),
  fc.constant<Event>({ kind: 'failure' }),
  fc.integer({ min: 0, max: 600_000 }).map((ms): Event => ({ kind: 'release', ms })),
);

async function apply(metrics: WorkerMetrics, events: Event[]): Promise<void> {
  for (const e of events) {
    if (e.kind === 'retry') metrics.recordAttempt(2);
    else if (e.kind === 'failure') metrics.recordFailure();
    else await metrics.recordReleaseLatency(e.ms);
  }
  await metrics.flushed();
}

const expected = (events: Event[]) => ({
  failures: events.filter((e) => e.kind === 'failure').length,
  retries: events.filter((e) => e.kind === 'retry').length,
  releases: events.filter((e) => e.kind === 'release').length,
});

test('across any number of restarts the durable figures count every event of every life of the host', async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(fc.array(event, { maxLength: 15 }), { minLength: 1, maxLength: 4 }), async (lives) => {
      const store = newStore();
      for (const life of lives) await apply(await WorkerMetrics.load('host-x', store), life);
      const all = lives.flat();
      // A host that never counted anything has written nothing yet.
      const written = (await store.read('host-x')) ?? { failures: 0, retries: 0, releases: 0, releaseLatencyMs: [] };
      expect(written).toMatchObject(expected(all));
      expect(written.releaseLatencyMs).toEqual(all.flatMap((e) => (e.kind === 'release' ? [e.ms] : [])));
    }),
    { numRuns: 25 },
  );
});

test('a first attempt is no retry; the Prometheus registry counts per host in seconds', async () => {
  const metrics = await WorkerMetrics.load('host-p', newStore());
  metrics.recordAttempt(1);
  metrics.recordAttempt(3);
  metrics.recordFailure();
  await metrics.recordReleaseLatency(1_500);
  const text = await metrics.registry.metrics();
  expect(text).toMatch(/^stasis_provider_retries_total\{host="host-p"\} 1$/m);
  expect(text).toMatch(/^stasis_provider_failures_total\{host="host-p"\} 1$/m);
  expect(text).toMatch(/^stasis_release_duration_seconds_count\{host="host-p"\} 1$/m);
  expect(text).toMatch(/^stasis_release_duration_seconds_sum\{host="host-p"\} 1\.5$/m);
  expect(text).toMatch(/^stasis_release_duration_seconds_bucket\{le="2\.5",host="host-p"\} 1$/m);
});

test('figures that cannot be read at start are never overwritten from zero; they are added to once readable', async () => {
  const inner = newStore();
  const earlier: HostFigures = {
    hostId: 'host-y',
    failures: 4,
    retries: 7,
    releases: 2,
    releaseLatencyMs: [10, 20],
    updatedAt: new Date().toISOString(),
  };
  await inner.write(earlier);
  let down = true;
  const flaky: FiguresStore = {
    write: (f) => (down ? Promise.reject(new Error('store down')) : inner.write(f)),
    read: (h) => (down ? Promise.reject(new Error('store down')) : inner.read(h)),
    readAll: () => inner.readAll(),
  };
  const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
  try {
    const metrics = await WorkerMetrics.load('host-y', flaky);
    await metrics.recordReleaseLatency(30);
    metrics.recordFailure();
    await metrics.flushed();
    expect(await inner.read('host-y')).toEqual(earlier);
    down = false;
    metrics.recordAttempt(2);
    await metrics.flushed();
    expect(await inner.read('host-y')).toMatchObject({
      failures: 5,
      retries: 8,
      releases: 3,
      releaseLatencyMs: [10, 20, 30],
    });
  } finally {
    warn.mockRestore();
  }
});

test('releases recorded without waiting for their writes are all in the durable figures once flushed, however slow the writes', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.integer({ min: 0, max: 600_000 }), { minLength: 1, maxLength: 20 }),
      fc.infiniteStream(fc.integer({ min: 0, max: 5 })),
      async (latencies, delays) => {
        const inner = newStore();
        const slow: FiguresStore = {
          write: async (f) => {
            await new Promise((resolve) => setTimeout(resolve, delays.next().value as number));
            await inner.write(f);
          },
          read: (h) => inner.read(h),
          readAll: () => inner.readAll(),
        };
        const metrics = await WorkerMetrics.load('host-s', slow);
        // As releaseSandbox does: counted now, the write left to run behind the release.
        for (const ms of latencies) void metrics.recordReleaseLatency(ms);
        expect(metrics.snapshot().releaseLatencyMs).toEqual(latencies);
        // What a worker's normal shutdown waits for.
        await metrics.flushed();
        expect(await inner.read('host-s')).toMatchObject({ releases: latencies.length, releaseLatencyMs: latencies });
      },
    ),
    { numRuns: 25 },
  );
});
