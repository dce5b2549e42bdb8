import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Connection } from '@temporalio/client';
import { temporal as proto } from '@temporalio/proto';
import { ensureBinary, ensureClusterBinaries } from '../../platform/binaries';
import { workflowBundle } from '../../workers/worker';
import { startMinio, type MinioServer } from '../../platform/minio-server';
import { freePorts } from '../../platform/ports';
import { S3FiguresStore, type FiguresStore, type HostFigures } from '../../stores/figures';
import { S3Client } from '@aws-sdk/client-s3';
import { eventually } from '../helpers/eventually';
import { makeCerts, type Certs } from './certs';
import { startPostgres, type Postgres } from './postgres';
import { baseEnv, sigkill, startStasis, terminate, type StasisProcess } from './processes';
import { mtlsOptions, setupSchemas, startTemporalCluster, type TemporalCluster } from './temporal-server';

// The AWS SDK warns that its Node 20 support ends in 2027; package.json already says Node >= 20.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';

// The shape of a production deployment on this machine: PostgreSQL, the Temporal
// server with an mTLS-only frontend, MinIO, the REST API as its own process and
// three worker hosts, every Stasis process connecting through TEMPORAL_TLS_*
// only. Runs are driven through the REST API; each scenario checks that no Run
// and no file is lost.

const HOSTS = ['host-1', 'host-2', 'host-3'];
const TOKEN = 'cluster-test-secret';

let dir: string;
let certs: Certs;
let pg: Postgres | undefined;
let temporal: TemporalCluster | undefined;
let minio: MinioServer | undefined;
let api: StasisProcess | undefined;
let apiUrl: string;
let stasisEnv: Record<string, string>;
let figures: FiguresStore;
const workers = new Map<string, StasisProcess>();
const hostMetricsAddr = new Map<string, string>();

// For the summary line.
const started = new Set<string>();
const completed = new Set<string>();
let killedHosts = 0;
let restoredElsewhere = 0;
let itemsLost = 0;

async function call<T>(method: string, route: string, body?: unknown): Promise<{ status: number; json: T }> {
  const response = await fetch(`${apiUrl}${route}`, {
    method,
    headers: {
      authorization: `Bearer ${TOKEN}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.text();
  return { status: response.status, json: (text ? JSON.parse(text) : undefined) as T };
}

async function ok<T>(method: string, route: string, body?: unknown): Promise<T> {
  const { status, json } = await call<T>(method, route, body);
  if (status >= 300) throw new Error(`${method} ${route}: ${status} ${JSON.stringify(json)}`);
  return json;
}

interface ResourceView {
  record: { state: string; hostId?: string; sandboxId: string; pauseMode?: string; checkpoint?: { uri: string } };
}
interface RunView {
  status: string;
  output?: unknown;
  interactions: { id: string; status: string }[];
}

/**
 * A Run that writes a file only it knows, waits on a person, then proves the file
 * survived. A DETACH Run keeps its sandbox, with a process running in it, on its host.
 */
function runSpec(marker: string, pauseMode?: 'DETACH') {
  return {
    agent: {
      driver: 'scripted',
      steps: [
        { writeFile: { path: 'marker.txt', content: marker } },
        ...(pauseMode === 'DETACH' ? [{ exec: 'sleep 600', background: true }] : []),
        { ask: 'Carry on?' },
        { expectFile: { path: 'marker.txt', content: marker } },
        { exec: 'cat marker.txt' },
        { complete: marker },
      ],
    },
    sandbox: { provider: 'local' },
    ...(pauseMode ? { policy: { pauseMode } } : {}),
  };
}

async function startRun(tag: string, pauseMode?: 'DETACH'): Promise<string> {
  const marker = `${tag}-${Math.random().toString(36).slice(2)}`;
  const { runId } = await ok<{ runId: string }>('POST', '/api/v1/runs', {
    ...runSpec(marker, pauseMode),
    labels: { marker },
  });
  started.add(runId);
  markers.set(runId, marker);
  return runId;
}
const markers = new Map<string, string>();

const resource = (runId: string) => ok<ResourceView>('GET', `/api/v1/runs/${runId}/resource`);

/** Waits until the Run waits on its question with its sandbox released in `mode`; returns the host that holds it. */
async function suspended(
  runId: string,
  mode: 'SNAPSHOT_AND_TERMINATE' | 'DETACH' = 'SNAPSHOT_AND_TERMINATE',
): Promise<string> {
  return eventually(
    async () => {
      const view = await resource(runId);
      return view.record.state === 'RELEASED' && view.record.pauseMode === mode && view.record.hostId;
    },
    180_000,
    `${runId} released (${mode})`,
  );
}

async function approve(runId: string): Promise<void> {
  await ok('POST', `/api/v1/runs/${runId}/interactions/int-1`, { decision: 'approve' });
}

/** Waits until the Run completed with its own marker (its file came back); counts what was lost. */
async function finished(runId: string): Promise<void> {
  const run = await eventually(
    async () => {
      const view = await ok<RunView>('GET', `/api/v1/runs/${runId}`);
      return ['COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT'].includes(view.status) && view;
    },
    240_000,
    `${runId} to finish`,
  );
  if (run.status === 'COMPLETED' && run.output === markers.get(runId)) completed.add(runId);
  else itemsLost += 1;
  expect(run).toMatchObject({ status: 'COMPLETED', output: markers.get(runId) });
}

function workerEnv(hostId: string, metricsPort: number): Record<string, string> {
  return {
    ...stasisEnv,
    STASIS_HOST_ID: hostId,
    STASIS_DATA_DIR: path.join(dir, 'hosts', hostId),
    STASIS_METRICS_ADDR: `127.0.0.1:${metricsPort}`,
    STASIS_WORKER_METRICS_ADDR: 'off',
  };
}

async function startWorker(hostId: string): Promise<void> {
  const addr = hostMetricsAddr.get(hostId) as string;
  const port = Number(addr.split(':')[1]);
  workers.set(
    hostId,
    await startStasis(hostId, 'worker', workerEnv(hostId, port), path.join(dir, 'logs'), 'stasis worker on host'),
  );
}

async function hostFigures(): Promise<Map<string, HostFigures>> {
  return new Map((await figures.readAll()).map((f) => [f.hostId, f]));
}

/** `stasis_release_duration_seconds_count` of a live host's Prometheus endpoint. */
async function promReleaseCount(hostId: string): Promise<number> {
  const text = await (await fetch(`http://${hostMetricsAddr.get(hostId)}/metrics`)).text();
  const match = new RegExp(`^stasis_release_duration_seconds_count\\{host="${hostId}"\\} (\\d+)$`, 'm').exec(text);
  if (!match) throw new Error(`no release histogram on ${hostId}:\n${text.slice(0, 2000)}`);
  return Number(match[1]);
}

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'stasis-cluster-'));
  // PostgreSQL runs as `nobody` when we are root: it must be able to pass through.
  chmodSync(dir, 0o711);
  mkdirSync(path.join(dir, 'logs'));
  // Built once per machine (cached), like the Temporal CLI and MinIO.
  const { server, sqlTool } = await ensureClusterBinaries();
  await ensureBinary('minio');
  // Bundled once here, so the worker processes (and their restarts) start in seconds.
  const bundleFile = path.join(dir, 'workflow-bundle.json');
  writeFileSync(bundleFile, JSON.stringify(await workflowBundle()));

  mkdirSync(path.join(dir, 'certs'));
  certs = makeCerts(path.join(dir, 'certs'));
  const [pgPort, minioPort, consolePort, httpPort, ...metricsPorts] = await freePorts(4 + HOSTS.length);
  HOSTS.forEach((host, i) => hostMetricsAddr.set(host, `127.0.0.1:${metricsPorts[i]}`));

  mkdirSync(path.join(dir, 'pg'));
  pg = await startPostgres(path.join(dir, 'pg'), pgPort);
  await setupSchemas(sqlTool, pg);
  temporal = await startTemporalCluster({ dir: path.join(dir, 'temporal'), server, pg, certs, namespace: 'stasis' });
  minio = await startMinio({ dataDir: path.join(dir, 'minio'), port: minioPort, consolePort, env: baseEnv() });

  const emptyToml = path.join(dir, 'empty-temporal.toml');
  writeFileSync(emptyToml, '[profile.default]\n');
  stasisEnv = {
    ...baseEnv(),
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    // No temporal.toml of the machine (an empty profile: a named file must exist): the connection is exactly these variables.
    TEMPORAL_CONFIG_FILE: emptyToml,
    TEMPORAL_ADDRESS: temporal.address,
    TEMPORAL_NAMESPACE: temporal.namespace,
    TEMPORAL_TLS_SERVER_CA_CERT_PATH: certs.ca,
    TEMPORAL_TLS_CLIENT_CERT_PATH: certs.clientCert,
    TEMPORAL_TLS_CLIENT_KEY_PATH: certs.clientKey,
    TEMPORAL_TLS_SERVER_NAME: 'localhost',
    STASIS_TASK_QUEUE: 'stasis',
    STASIS_WORKFLOW_BUNDLE: bundleFile,
    STASIS_S3_ENDPOINT: minio.endpoint,
    STASIS_S3_BUCKET: minio.bucket,
    STASIS_S3_REGION: minio.region,
    AWS_ACCESS_KEY_ID: minio.accessKeyId ?? '',
    AWS_SECRET_ACCESS_KEY: minio.secretAccessKey ?? '',
  };
  figures = new S3FiguresStore(
    new S3Client({
      region: minio.region,
      endpoint: minio.endpoint,
      forcePathStyle: true,
      credentials: { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' },
    }),
    minio.bucket,
  );

  api = await startStasis(
    'api',
    'api',
    {
      ...stasisEnv,
      STASIS_HOST_ID: 'api',
      STASIS_DATA_DIR: path.join(dir, 'api'),
      STASIS_HTTP_ADDR: `127.0.0.1:${httpPort}`,
      STASIS_API_TOKENS: `ops:${TOKEN}`,
    },
    path.join(dir, 'logs'),
    'stasis api:',
  );
  apiUrl = `http://127.0.0.1:${httpPort}`;
  await Promise.all(HOSTS.map((host) => startWorker(host)));
}, 45 * 60_000);

afterAll(async () => {
  for (const p of [...workers.values(), ...(api ? [api] : [])]) await sigkill(p);
  await minio?.stop();
  await temporal?.stop();
  await pg?.stop();
  process.stdout.write(
    `\ncluster: hosts=${HOSTS.length} runs=${started.size} killed_hosts=${killedHosts} ` +
      `restored_elsewhere=${restoredElsewhere} items_lost=${itemsLost + (started.size - completed.size)}\n`,
  );
  if (process.env.STASIS_KEEP_CLUSTER_DIR) process.stdout.write(`cluster: logs kept in ${dir}\n`);
  else rmSync(dir, { recursive: true, force: true });
}, 120_000);

test('the frontend serves mTLS only: no certificate, or one from another CA, is refused', async () => {
  const address = temporal!.address;
  const attempt = async (options: Parameters<typeof Connection.connect>[0]) => {
    const connection = await Connection.connect({ ...options, connectTimeout: 5_000 });
    try {
      await connection.workflowService.getSystemInfo({});
    } finally {
      await connection.close();
    }
  };
  const ca = readFileSync(certs.ca);
  await expect(attempt({ address })).rejects.toThrow();
  await expect(
    attempt({ address, tls: { serverRootCACertificate: ca, serverNameOverride: 'localhost' } }),
  ).rejects.toThrow();
  await expect(
    attempt({
      address,
      tls: {
        serverRootCACertificate: ca,
        serverNameOverride: 'localhost',
        clientCertPair: { crt: readFileSync(certs.strangerCert), key: readFileSync(certs.strangerKey) },
      },
    }),
  ).rejects.toThrow();
  await expect(attempt(mtlsOptions(address, certs))).resolves.toBeUndefined();
});

const waiting = new Map<string, string>(); // runId → host holding its checkpointed sandbox
let victim: string;

/** The hosts whose workers poll the shared task queue for activities (where a Run is provisioned). */
async function pollingHosts(): Promise<Set<string>> {
  const connection = await Connection.connect(mtlsOptions(temporal!.address, certs));
  try {
    const { pollers } = await connection.workflowService.describeTaskQueue({
      namespace: temporal!.namespace,
      taskQueue: { name: 'stasis' },
      taskQueueType: proto.api.enums.v1.TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    });
    return new Set((pollers ?? []).map((p) => (p.identity ?? '').replace(/^stasis@/, '')));
  } finally {
    await connection.close();
  }
}

test('Runs spread across the three hosts, each released to a checkpoint while it waits', async () => {
  // Whichever host's poller the server matches provisions a Run: every host must be
  // polling first, then Runs start until every host holds some (the server's task
  // queue partitions do not spread tasks evenly over a few Runs).
  await eventually(
    async () => {
      const polling = await pollingHosts();
      return HOSTS.every((host) => polling.has(host));
    },
    60_000,
    'every host polling the shared task queue',
  );
  for (let round = 0; round < 20 && new Set(waiting.values()).size < HOSTS.length; round++) {
    const ids = await Promise.all(HOSTS.map(() => startRun('spread')));
    for (const runId of ids) waiting.set(runId, await suspended(runId));
  }
  expect(new Set(waiting.values())).toEqual(new Set(HOSTS));
  for (const runId of waiting.keys()) expect((await resource(runId)).record.checkpoint?.uri).toMatch(/^s3:\/\//);
  // Each host's Prometheus endpoint counts the releases it made.
  for (const host of HOSTS) {
    const held = [...waiting.values()].filter((h) => h === host).length;
    expect(await promReleaseCount(host)).toBeGreaterThanOrEqual(held);
  }
  // The hosts' durable figures count every release: written just behind it (a release does not wait for them).
  const written = (byHost: Map<string, HostFigures>) =>
    HOSTS.every((host) => (byHost.get(host)?.releases ?? 0) >= [...waiting.values()].filter((h) => h === host).length);
  await eventually(async () => written(await hostFigures()), 30_000, 'the durable figures to count every release');
}, 600_000);

test('SIGKILL a host while its Runs are suspended: they restore on the others from their checkpoints and complete', async () => {
  const counts = HOSTS.map((host) => [host, [...waiting.values()].filter((h) => h === host).length] as const);
  victim = counts.sort((a, b) => b[1] - a[1])[0][0];
  const victimRuns = [...waiting].filter(([, host]) => host === victim).map(([runId]) => runId);
  // Every release of the victim is in its figures by now (the previous test waited for them).
  const before = (await hostFigures()).get(victim)?.releases ?? 0;
  await sigkill(workers.get(victim)!);
  workers.delete(victim);
  killedHosts += 1;

  await Promise.all(victimRuns.map((runId) => approve(runId)));
  await Promise.all(
    victimRuns.map(async (runId) => {
      await finished(runId);
      const host = (await resource(runId)).record.hostId;
      expect(host).not.toBe(victim);
      expect(HOSTS).toContain(host);
      restoredElsewhere += 1;
      waiting.delete(runId);
    }),
  );
  // The dead host's releases still count.
  expect((await hostFigures()).get(victim)?.releases).toBe(before);
}, 600_000);

test("restart a host's worker: the sandboxes it kept for waiting Runs are re-adopted, not lost", async () => {
  const live = HOSTS.filter((h) => h !== victim);
  // DETACH keeps the sandbox on its host while the Run waits (released without a checkpoint).
  const detached = new Map<string, string>();
  for (let round = 0; round < 4 && !live.every((h) => [...detached.values()].includes(h)); round++) {
    const ids = await Promise.all(live.map(() => startRun('detach', 'DETACH')));
    for (const runId of ids) detached.set(runId, await suspended(runId, 'DETACH'));
  }
  const host = live[0];
  const onHost = [...detached].filter(([, h]) => h === host).map(([runId]) => runId);
  expect(onHost.length).toBeGreaterThan(0);

  const releasesBefore = (await hostFigures()).get(host)?.releases ?? 0;
  await terminate(workers.get(host)!);
  await startWorker(host);

  await Promise.all([...detached.keys()].map((runId) => approve(runId)));
  await Promise.all([...detached.keys()].map((runId) => finished(runId)));
  // Re-attached where they were kept: nothing was restored elsewhere or lost.
  for (const runId of onHost) expect((await resource(runId)).record.hostId).toBe(host);
  // The restarted host counts on from its durable figures.
  expect((await hostFigures()).get(host)?.releases).toBeGreaterThanOrEqual(releasesBefore);
}, 600_000);

test('restart the Temporal server in the middle of releases and restores: every Run completes', async () => {
  // Restores in flight: the Runs still waiting are answered; releases in flight: new Runs.
  const answered = [...waiting.keys()];
  const fresh = await Promise.all([0, 1, 2].map(() => startRun('restart')));
  await Promise.all(answered.map((runId) => approve(runId)));
  await temporal!.restart();

  for (const runId of fresh) await suspended(runId);
  await Promise.all(fresh.map((runId) => approve(runId)));
  await Promise.all([...answered, ...fresh].map((runId) => finished(runId)));
  for (const runId of answered) waiting.delete(runId);
}, 600_000);

test('the metrics snapshot counts every host, the killed one included, and survives a worker restart', async () => {
  const byHost = await hostFigures();
  expect([...byHost.keys()].sort()).toEqual(HOSTS);
  const total = [...byHost.values()].reduce((n, f) => n + f.releases, 0);
  // Every Run was released once while it waited (more only if a release was retried).
  expect(total).toBeGreaterThanOrEqual(started.size);
  const snapshot = await ok<{ releaseLatencyMs: { count: number; max: number }; failures: number; retries: number }>(
    'GET',
    '/api/v1/metrics',
  );
  expect(snapshot.releaseLatencyMs.count).toBe(total);
  expect(snapshot.releaseLatencyMs.max).toBeGreaterThan(0);
  expect(snapshot.failures).toBe([...byHost.values()].reduce((n, f) => n + f.failures, 0));
  expect(snapshot.retries).toBe([...byHost.values()].reduce((n, f) => n + f.retries, 0));

  // Restart a worker: the snapshot does not go back.
  const host = HOSTS.find((h) => h !== victim) as string;
  await terminate(workers.get(host)!);
  await startWorker(host);
  const after = await ok<{ releaseLatencyMs: { count: number } }>('GET', '/api/v1/metrics');
  expect(after.releaseLatencyMs.count).toBe(total);
  // Every Run completed with its own file: nothing lost.
  expect(completed.size).toBe(started.size);
  expect(itemsLost).toBe(0);
}, 600_000);
