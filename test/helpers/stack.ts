import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { historyToJSON } from '@temporalio/common/lib/proto-utils';
import * as os from 'node:os';
import * as path from 'node:path';
import { randomUUID } from 'node:crypto';
import { Client, Connection } from '@temporalio/client';
import { DefaultLogger, LogTimestamp, NativeConnection, Runtime, type LogEntry } from '@temporalio/worker';
import { loadConfig, type Config } from '../../common/config';
import { freePort, startTemporal, type TemporalServer } from '../../platform/servers';
import { StasisClient } from '../../client';
import { clientOptions } from '../../client/options';
import { createStasisWorker, type StasisWorker, type StasisWorkerOptions } from '../../workers/worker';

export { eventually, saw } from './eventually';

// A real Stasis stack for one test file: its own task queue (so parallel test
// files never take each other's tasks) and data dir, a worker per host, and the
// typed client, against the Temporal dev server and MinIO of the global setup.

export interface TestStack {
  config: Config;
  client: StasisClient;
  temporal: Client;
  workers: Map<string, StasisWorker>;
  /** Starts (another) worker for `hostId` on this stack's task queue. */
  startWorker(hostId: string, extra?: Partial<StasisWorkerOptions>): Promise<StasisWorker>;
  stopWorker(hostId: string): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Saves the histories of the closed workflows this stack ran, for the replay test.
 * `STASIS_RECORD_HISTORIES=<dir>` turns it on (see test/histories/README.md).
 */
async function recordHistories(temporal: Client, taskQueue: string, dir: string): Promise<void> {
  mkdirSync(dir, { recursive: true });
  for await (const wf of temporal.workflow.list({ query: `TaskQueue = '${taskQueue}'` })) {
    if (wf.status.name === 'RUNNING') continue;
    // The workflow id is part of what a workflow computes (the Run's hashes): keep it in the name.
    const name = `${wf.workflowId}__${wf.runId}`;
    const history = await temporal.workflow.getHandle(wf.workflowId, wf.runId).fetchHistory();
    writeFileSync(path.join(dir, `${name}.json`), historyToJSON(history));
  }
}

/** What the workers of this test file logged at WARN and above (the most recent 10,000 entries). */
export const workerLogs: LogEntry[] = [];
/** Entries whose message matches one of these are kept in workerLogs but not printed (a test provoking them by the hundred). */
export const unprintedWorkerLogs: RegExp[] = [];

let runtimeInstalled = false;
/** Worker logs at WARN, so test output shows what matters. */
function quietRuntime(): void {
  if (runtimeInstalled) return;
  runtimeInstalled = true;
  const printer = new DefaultLogger('WARN');
  Runtime.install({
    logger: new DefaultLogger('WARN', (entry) => {
      workerLogs.push(entry);
      if (workerLogs.length > 10_000) workerLogs.shift();
      if (unprintedWorkerLogs.some((pattern) => pattern.test(entry.message))) return;
      printer.log(entry.level, entry.message, { ...entry.meta, [LogTimestamp]: entry.timestampNanos });
    }),
  });
}

export interface StackOptions {
  env?: Record<string, string>;
  hostId?: string;
  worker?: Partial<StasisWorkerOptions>;
  startWorker?: boolean;
}

export async function startStack(options: StackOptions = {}): Promise<TestStack> {
  quietRuntime();
  const dataDir = mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'stack-'));
  const config = loadConfig({
    ...process.env,
    STASIS_TASK_QUEUE: `test-${randomUUID().slice(0, 8)}`,
    STASIS_DATA_DIR: dataDir,
    STASIS_HOST_ID: options.hostId ?? 'host-a',
    // Active workspaces of the tests live in the system's temporary directory.
    STASIS_HOST_PATHS: os.tmpdir(),
    ...options.env,
  });
  const connection = await Connection.connect(config.temporal.connectionOptions);
  const temporal = new Client({ connection, namespace: config.TEMPORAL_NAMESPACE });
  const client = new StasisClient(temporal, clientOptions(config));
  const workers = new Map<string, StasisWorker>();
  const runs = new Map<string, Promise<void>>();
  const nativeConnections = new Map<string, NativeConnection>();

  const stack: TestStack = {
    config,
    client,
    temporal,
    workers,
    async startWorker(hostId, extra = {}) {
      const native = await NativeConnection.connect(config.temporal.connectionOptions);
      nativeConnections.set(hostId, native);
      const worker = await createStasisWorker({
        config: { ...config, STASIS_HOST_ID: hostId },
        connection: native,
        ...options.worker,
        ...extra,
      });
      workers.set(hostId, worker);
      runs.set(hostId, worker.run());
      return worker;
    },
    async stopWorker(hostId) {
      await workers.get(hostId)?.shutdown();
      await runs.get(hostId);
      await nativeConnections.get(hostId)?.close();
      workers.delete(hostId);
      runs.delete(hostId);
      nativeConnections.delete(hostId);
    },
    async stop() {
      if (process.env.STASIS_RECORD_HISTORIES)
        await recordHistories(temporal, config.STASIS_TASK_QUEUE, process.env.STASIS_RECORD_HISTORIES);
      for (const hostId of [...workers.keys()]) await stack.stopWorker(hostId);
      await connection.close();
    },
  };
  if (options.startWorker !== false) await stack.startWorker(config.STASIS_HOST_ID);
  return stack;
}

/**
 * The stack of this test file: `start` runs before its tests and the stack stops after them. Its
 * fields are there from then on: read them in tests and hooks, not while the file loads.
 */
export function useStack(start: () => Promise<TestStack> = () => startStack()): TestStack {
  const stack = {} as TestStack;
  beforeAll(async () => {
    Object.assign(stack, await start());
  });
  afterAll(async () => {
    // Nothing to stop when the start failed.
    if ('stop' in stack) await stack.stop();
  });
  return stack;
}

/**
 * A Temporal dev server of the test's own, on `port` with its database in `dataDir`: never the
 * shared one of the global setup (whose TEMPORAL_ADDRESS the test workers inherit).
 */
export function startOwnTemporal(options: {
  dataDir: string;
  port: number;
  extraArgs?: string[];
}): Promise<TemporalServer> {
  return startTemporal({ ...options, env: { ...process.env, TEMPORAL_ADDRESS: '' } });
}

/**
 * A stack on a Temporal dev server of its own that suggests continue-as-new after
 * `suggestContinueAsNewAfter` history events, so long Runs and sandboxes really continue as new
 * (and carry their state) within a test. Its stop() stops that server too.
 */
export function startStackOnOwnTemporal(
  suggestContinueAsNewAfter: number,
  options: StackOptions = {},
): Promise<TestStack> {
  return startStackOnTemporalWith([`limit.historyCount.suggestContinueAsNew=${suggestContinueAsNewAfter}`], options);
}

/** A stack on a Temporal dev server of its own with `dynamicConfig` (`key=value` each). Its stop() stops that server too. */
export async function startStackOnTemporalWith(
  dynamicConfig: string[],
  options: StackOptions = {},
): Promise<TestStack> {
  const temporal = await startOwnTemporal({
    dataDir: mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'own-temporal-')),
    port: await freePort(),
    extraArgs: dynamicConfig.flatMap((value) => ['--dynamic-config-value', value]),
  });
  let stack: TestStack;
  try {
    stack = await startStack({ ...options, env: { ...options.env, TEMPORAL_ADDRESS: temporal.address } });
  } catch (error) {
    await temporal.stop();
    throw error;
  }
  return {
    ...stack,
    async stop() {
      try {
        await stack.stop();
      } finally {
        await temporal.stop();
      }
    },
  };
}
