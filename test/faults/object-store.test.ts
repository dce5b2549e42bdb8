import { minioFromState, type MinioServerControl } from '../../platform/servers';
import { S3CheckpointStore } from '../../stores/s3';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { evictDormantCopies } from '../helpers/hosts';
import { checkpointKeys, testS3 } from '../helpers/s3';
import { eventually, saw, startStack, type TestStack } from '../helpers/stack';
import {
  checkpointVerifies,
  cycleSpec,
  failedReleaseView,
  failedWorkflowTasks,
  historyEvents,
  releasedView,
  sleep,
  Tally,
  workspaceIntact,
  writeSummary,
} from './helpers';
import { startS3Proxy, type FaultProxy } from './s3-proxy';

// Area 3, the object store failing under Runs: the shared MinIO stopped while
// snapshot releases run and while restores download, and a fault-injecting
// proxy in front of MinIO answering 503s or answering slowly. Releases and
// restores are retried with backoff (1 s, 2 s, 4 s ... observed), the Run stays
// waiting (or resuming) and answerable, and once the store is back every Run
// finishes with its workspace intact. Runs per scenario: RUNS.

const RUNS = 2;
/** The S3 client's idle timeout behind the proxy (the product default is 120 s). */
const PROXY_SOCKET_TIMEOUT_MS = 3_000;
const tally = new Tally();
const s3 = testS3();

function sharedMinio(): MinioServerControl {
  const stateFile = process.env.STASIS_TEST_MINIO_STATE;
  if (!stateFile)
    throw new Error('STASIS_TEST_MINIO_STATE is unset: the fault tests need the MinIO the jest global setup started');
  return minioFromState(stateFile);
}

interface Harness {
  stack: TestStack;
  faults: ReleaseFaults;
}

async function harness(endpoint?: string): Promise<Harness> {
  const faults: ReleaseFaults = { calls: [], restoreCalls: [] };
  // Through the proxy: the store as the worker makes it, with a short idle timeout so a stalled request fails in seconds.
  const store = endpoint
    ? new S3CheckpointStore({
        endpoint,
        bucket: process.env.STASIS_S3_BUCKET ?? 'stasis',
        region: process.env.STASIS_S3_REGION ?? 'us-east-1',
        credentials: {
          accessKeyId: process.env.AWS_ACCESS_KEY_ID ?? '',
          secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY ?? '',
        },
        socketTimeoutMs: PROXY_SOCKET_TIMEOUT_MS,
      })
    : undefined;
  const stack = await startStack({
    ...(endpoint ? { env: { STASIS_S3_ENDPOINT: endpoint } } : {}),
    worker: { providers: [faultyProvider(faults)], ...(store ? { store } : {}) },
  });
  return { stack, faults };
}

const sandboxOf = (runId: string) => `${runId}-sbx`;
const callsOf = (h: Harness, runId: string) => h.faults.calls.filter((c) => c.sandboxId === sandboxOf(runId));
const restoresOf = (h: Harness, runId: string) =>
  (h.faults.restoreCalls ?? []).filter((c) => c.sandboxId === sandboxOf(runId));

async function startRuns(h: Harness, scenario: string, count = RUNS): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const runId = `faults-store-${scenario}-${i}-${Date.now().toString(36)}`;
    tally.start(runId, `${scenario}: run ${runId}`);
    await h.stack.client.runs.start({ ...cycleSpec(runId, 'faulty'), runId });
    ids.push(runId);
  }
  return ids;
}

/** While the store fails: the release is retried, the Run waits, its interaction is pending, its compute runs. */
async function retryingRelease(h: Harness, runId: string, attempts: number): Promise<void> {
  const view = await failedReleaseView(h.stack.client, runId, attempts, 90_000);
  expect(view).toMatchObject({ phase: 'SUSPENDED', record: { state: 'RELEASING' } });
  const snapshot = await h.stack.client.runs.get(runId);
  expect(snapshot.status).toBe('WAITING');
  expect(snapshot.interactions[0].status).toBe('pending');
  expect(await h.stack.workers.get('host-a')!.registry.get('faulty').processCount(sandboxOf(runId))).toBeGreaterThan(0);
}

/** The release happened exactly once, the checkpoint verifies, no process is left, then answer and check the resumed Run. */
async function releasedOnce(h: Harness, runId: string): Promise<void> {
  const view = await releasedView(h.stack.client, runId);
  expect(callsOf(h, runId).filter((c) => c.outcome === 'released')).toHaveLength(1);
  expect(view.record.checkpoint).toBeDefined();
  expect(await checkpointVerifies(s3, view.record.checkpoint!)).toBe(true);
  expect(await checkpointKeys(s3, sandboxOf(runId))).toHaveLength(1);
  expect(await h.stack.workers.get('host-a')!.registry.get('faulty').processCount(sandboxOf(runId))).toBe(0);
}

async function answerAndFinish(h: Harness, runId: string): Promise<void> {
  await h.stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await finished(h, runId);
}

async function finished(h: Harness, runId: string): Promise<void> {
  await expect(h.stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({ tag: runId });
  const events = await historyEvents(h.stack.temporal, runId);
  expect(failedWorkflowTasks(events)).toEqual([]);
  expect(workspaceIntact(events)).toBe(true);
  expect(await h.stack.workers.get('host-a')!.registry.get('faulty').processCount(sandboxOf(runId))).toBe(0);
  tally.ok(runId);
}

describe('the shared MinIO stopped', () => {
  let h: Harness;
  const minio = sharedMinio();
  beforeAll(async () => {
    h = await harness();
  });
  afterAll(async () => {
    await minio.start();
    await h?.stack.stop();
  });

  test('during the snapshot release: retried while down, released once when back, then resumed intact', async () => {
    await minio.stop();
    tally.inject();
    const runs = await startRuns(h, 'minio-down-release');
    for (const runId of runs) await retryingRelease(h, runId, 3);
    for (const runId of runs)
      expect((await h.stack.client.runs.resource(runId)).record.lastError).toMatch(/ECONNREFUSED|connect|socket/i);
    await minio.start();
    for (const runId of runs) await releasedOnce(h, runId);
    await Promise.all(runs.map((runId) => answerAndFinish(h, runId)));
    tally.inject(
      runs.reduce((n, runId) => n + callsOf(h, runId).filter((c) => c.outcome.startsWith('refused')).length, 0),
    );
  }, 240_000);

  test('during the restore: the download is retried while down (the Run keeps resuming), the Run finishes when it is back', async () => {
    const runs = await startRuns(h, 'minio-down-restore');
    for (const runId of runs) await releasedOnce(h, runId);
    expect((await evictDormantCopies(h.stack)).sort()).toEqual(runs.map(sandboxOf).sort());
    await minio.stop();
    tally.inject();
    for (const runId of runs) await h.stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
    // Longer than Temporal's first four retries (1+2+4+8 s): an outage of minutes must not fail the Run.
    for (const runId of runs) {
      await eventually(
        async () => saw(restoresOf(h, runId).filter((c) => c.outcome.startsWith('refused')).length) >= 5,
        120_000,
        `${runId}: 5 failed restores`,
      );
    }
    await sleep(2_000);
    for (const runId of runs) {
      const view = await h.stack.client.runs.resource(runId);
      expect(view).toMatchObject({ phase: 'RESUMING', record: { state: 'RESTORING' } });
      // The operator sees the restore retrying, and why.
      expect(view.record.attempts).toBeGreaterThanOrEqual(5);
      expect(view.record.lastError).toMatch(/ECONNREFUSED|connect|socket/i);
      expect((await h.stack.client.runs.get(runId)).status).toBe('RUNNING');
    }
    await minio.start();
    await Promise.all(runs.map((runId) => finished(h, runId)));
    tally.inject(
      runs.reduce((n, runId) => n + restoresOf(h, runId).filter((c) => c.outcome.startsWith('refused')).length, 0),
    );
  }, 240_000);
});

describe('a fault-injecting proxy in front of MinIO', () => {
  let h: Harness;
  let proxy: FaultProxy;
  beforeAll(async () => {
    proxy = await startS3Proxy(process.env.STASIS_S3_ENDPOINT ?? '');
    h = await harness(proxy.url);
  });
  afterAll(async () => {
    await h?.stack.stop();
    await proxy?.close();
  });

  test('503 SlowDown on every request: the release backs off 1 s, 2 s, 4 s ... (up to 5 min), nothing is lost', async () => {
    proxy.mode = { kind: '503' };
    const runs = await startRuns(h, 'proxy-503');
    for (const runId of runs) await retryingRelease(h, runId, 4);
    for (const runId of runs) {
      await eventually(
        async () => saw(callsOf(h, runId).filter((c) => c.outcome.startsWith('refused')).length) >= 4,
        60_000,
        `${runId}: 4 failed releases`,
      );
      expect((await h.stack.client.runs.resource(runId)).record.lastError).toMatch(/SlowDown|503|injected/i);
    }
    proxy.mode = { kind: 'pass' };
    for (const runId of runs) {
      await releasedOnce(h, runId);
      const starts = callsOf(h, runId).map((c) => c.at);
      expect(starts.length).toBeGreaterThanOrEqual(5);
      // Temporal waits at least 1 s, 2 s, 4 s between attempts, and the waits grow.
      const gaps = starts.slice(1, 4).map((at, i) => at - starts[i]);
      expect(gaps.map((gap, i) => gap >= 900 * 2 ** i)).toEqual([true, true, true]);
      expect(gaps[2]).toBeGreaterThan(gaps[0]);
      // The policy behind it, as scheduled: 1 s initial, coefficient 2, at most 5 min apart, no attempt limit.
      const scheduled = (await historyEvents(h.stack.temporal, runId)).find(
        (e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'releaseSandbox',
      )?.activityTaskScheduledEventAttributes?.retryPolicy;
      expect({
        initial: Number(scheduled?.initialInterval?.seconds),
        coefficient: scheduled?.backoffCoefficient,
        maximum: Number(scheduled?.maximumInterval?.seconds),
        attempts: scheduled?.maximumAttempts ?? 0,
      }).toEqual({ initial: 1, coefficient: 2, maximum: 300, attempts: 0 });
    }
    expect(proxy.requests.filter((r) => r.outcome === '503').length).toBeGreaterThanOrEqual(4 * RUNS);
    tally.inject(proxy.requests.filter((r) => r.outcome === '503').length);
    await Promise.all(runs.map((runId) => answerAndFinish(h, runId)));
  }, 240_000);

  test('a stalled store (requests accepted, never answered): each attempt fails on the idle timeout and is retried, nothing is lost', async () => {
    proxy.mode = { kind: 'stall' };
    const runs = await startRuns(h, 'proxy-stall');
    for (const runId of runs) {
      await eventually(
        async () => saw(callsOf(h, runId).filter((c) => c.outcome.startsWith('refused')).length) >= 2,
        90_000,
        `${runId}: 2 failed releases`,
      );
      await retryingRelease(h, runId, 2);
      expect((await h.stack.client.runs.resource(runId)).record.lastError).toMatch(/timed out|timeout/i);
    }
    proxy.mode = { kind: 'pass' };
    for (const runId of runs) await releasedOnce(h, runId);
    tally.inject(proxy.requests.filter((r) => r.outcome === 'stalled').length);
    await Promise.all(runs.map((runId) => answerAndFinish(h, runId)));
  }, 240_000);

  test('a slow store (every request delayed 1 s): releases and downloads take longer, nothing is lost', async () => {
    proxy.mode = { kind: 'delay', ms: 1_000 };
    const delayedBefore = proxy.requests.filter((r) => r.outcome === 'delayed').length;
    const runs = await startRuns(h, 'proxy-slow');
    for (const runId of runs) await releasedOnce(h, runId);
    await evictDormantCopies(h.stack);
    await Promise.all(runs.map((runId) => answerAndFinish(h, runId)));
    // Every restore downloaded its checkpoint through the slow proxy.
    for (const runId of runs) expect(restoresOf(h, runId).map((c) => c.outcome)).toEqual(['restored from checkpoint']);
    tally.inject(proxy.requests.filter((r) => r.outcome === 'delayed').length - delayedBefore);
    proxy.mode = { kind: 'pass' };
  }, 240_000);
});

test('summary: every Run finished with its workspace, nothing lost', () => {
  writeSummary('object-store', tally, { runs_per_scenario: RUNS });
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBe(5 * RUNS);
});
