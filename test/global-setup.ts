import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { freePorts, startMinio, startTemporal } from '../platform/servers';
import { saveTestServers, type TestServers } from './servers-state';
import teardown from './global-teardown';

// Starts one Temporal dev server and one MinIO for the whole jest run, on free
// ports with a fresh data dir, and hands their coordinates to the test workers
// through process.env (workers are forked after this and inherit it). On a
// fresh machine the first run builds the server binaries first (minutes).
export default async function globalSetup(): Promise<void> {
  // The AWS SDK warns in every worker that its Node 20 support ends in 2027; package.json already says Node >= 20.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'stasis-test-'));
  const servers: TestServers = { dataDir, minioStateFile: path.join(dataDir, 'minio-state.json'), replacedEnv: {} };
  saveTestServers(servers);
  // Tests that run a process as another user (nobody) reach their files under it, as they did in /tmp:
  // the data dir is searchable (not listable) by others, its tmp/ is like /tmp itself.
  fs.chmodSync(dataDir, 0o711);
  const tmpDir = path.join(dataDir, 'tmp');
  fs.mkdirSync(tmpDir);
  fs.chmodSync(tmpDir, 0o1777);
  const [temporalPort, minioPort, consolePort] = await freePorts(3);
  // An explicit TEMPORAL_ADDRESS (an existing server) keeps its namespace; our own dev server uses default.
  const namespace = process.env.TEMPORAL_ADDRESS ? (process.env.TEMPORAL_NAMESPACE ?? 'default') : 'default';
  // Both at once; wait for both to settle, so a failure never leaves the other one starting.
  const [temporal, minio] = await Promise.allSettled([
    startTemporal({ dataDir, port: temporalPort, namespace }),
    startMinio({ dataDir, port: minioPort, consolePort, stateFile: servers.minioStateFile }),
  ]);
  if (temporal.status === 'fulfilled') servers.temporal = temporal.value;
  if (minio.status === 'fulfilled') servers.minio = minio.value;
  if (temporal.status === 'rejected' || minio.status === 'rejected') {
    await teardown();
    throw [temporal, minio].find((result): result is PromiseRejectedResult => result.status === 'rejected')?.reason;
  }
  const exported: Record<string, string | undefined> = {
    TEMPORAL_ADDRESS: temporal.value.address,
    TEMPORAL_NAMESPACE: temporal.value.namespace,
    STASIS_S3_ENDPOINT: minio.value.endpoint,
    STASIS_S3_BUCKET: minio.value.bucket,
    STASIS_S3_REGION: minio.value.region,
    AWS_ACCESS_KEY_ID: minio.value.accessKeyId,
    AWS_SECRET_ACCESS_KEY: minio.value.secretAccessKey,
    // Only a MinIO we started can be stopped and restarted by a fault test.
    STASIS_TEST_MINIO_STATE: minio.value.started ? servers.minioStateFile : undefined,
    STASIS_TEST_DATA_DIR: dataDir,
    // Every temporary directory a test makes (os.tmpdir()) is under the data dir, which the teardown
    // removes: tests that kept theirs left gigabytes in /tmp run after run on the same machine.
    TMPDIR: tmpDir,
    // Tests leave their sandboxes behind in temporary directories, where each volume would stay mounted:
    // only the tests of volumes turn them on, and destroy what they made.
    STASIS_SANDBOX_VOLUMES: process.env.STASIS_SANDBOX_VOLUMES ?? 'off',
    // A `stasis worker` or `stasis api` a test starts serves nothing on the default ports, which a
    // `npm start` running beside `npm test` holds (tests that read them choose free ports).
    STASIS_WORKER_METRICS_ADDR: process.env.STASIS_WORKER_METRICS_ADDR ?? 'off',
    STASIS_METRICS_ADDR: process.env.STASIS_METRICS_ADDR ?? 'off',
    STASIS_HTTP_ADDR: process.env.STASIS_HTTP_ADDR ?? '127.0.0.1:0',
  };
  for (const [name, value] of Object.entries(exported)) {
    if (value === undefined) continue;
    servers.replacedEnv[name] = process.env[name];
    process.env[name] = value;
  }
}
