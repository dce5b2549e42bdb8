import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HeadObjectCommand, ListMultipartUploadsCommand } from '@aws-sdk/client-s3';
import { Client, Connection } from '@temporalio/client';
import { StasisClient } from '../../client';
import { killSandbox, scanSandboxProcesses, sandboxProcesses } from '../../providers/processes';
import { workflowBundle } from '../../workers/worker';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';
import { eventually, saw } from '../helpers/stack';
import {
  checkpointVerifies,
  cycleSpec,
  failedWorkflowTasks,
  historyEvents,
  Tally,
  workspaceIntact,
  writeSummary,
} from './helpers';
import { MID_UPLOAD_BYTES, RELEASE_POINTS, RESTORE_POINTS, type KillPoint } from './kill-points';

// Area 4, the worker killed with SIGKILL in the middle of releases and
// restores. The worker is a separate process (kill-worker.ts: the real worker,
// the real local or bwrap provider and S3 store, which stop at named points of a
// release or restore); Runs are started from here with the typed client. Each
// Run's release stops at one point (before the snapshot, mid-upload with a
// multipart upload in progress, after the upload before terminate, after
// terminate before the activity completes); once every Run has stopped, the
// worker is SIGKILLed and started again. Then each Run's restore stops at one
// point (before, after) and the worker is killed again. Every Run must end
// consistent: compute released exactly once (one receipt, one non-duplicate
// release), no process left, the checkpoint intact and verified, the
// interaction still pending and answerable, the workspace byte-identical after
// the resume. Trials: RUNS releases and RUNS restores, in two kills. The same
// trials run with the `local` provider (worker-kill.test.ts) and with `bwrap`
// (worker-kill-bwrap.test.ts), whose sandboxes must outlive their worker too.

/** The provider the killable worker wraps. */
export type KillProvider = 'local' | 'bwrap';

/** Registers the trials of one provider in the calling test file; `area` names its summary line. */
export function workerKillTrials(provider: KillProvider, area: string): void {
  const RUNS_PER_RELEASE_POINT = 3;
  const RUNS = RUNS_PER_RELEASE_POINT * RELEASE_POINTS.length;
  /**
   * Incompressible, and larger than a pack and than one multipart part: the mid-upload stop has a pack's
   * PutObject cut part-way (content-addressed checkpoints) or a multipart upload in progress (tar.gz).
   */
  const LARGE_BLOB = 2 * MID_UPLOAD_BYTES;

  const ROOT = path.join(__dirname, '..', '..');
  const tally = new Tally();
  const s3 = testS3();
  const hostId = `killable-${provider}-${randomUUID().slice(0, 8)}`;
  const taskQueue = `kill-${randomUUID().slice(0, 8)}`;
  let dir: string;
  let dataDir: string;
  let files: { bundle: string; plan: string; markers: string; log: string; output: string };
  let client: StasisClient;
  let worker: ChildProcess | undefined;
  let kills = 0;
  /** What was left in the store once the Runs completed: checkpoint objects, unfinished multipart uploads. */
  let leftInStore = { left: -1, unfinished: -1 };
  const plan: Record<string, KillPoint> = {};

  beforeAll(async () => {
    dir = mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'worker-kill-'));
    dataDir = path.join(dir, 'data');
    files = {
      bundle: path.join(dir, 'bundle.json'),
      plan: path.join(dir, 'plan.json'),
      markers: path.join(dir, 'markers'),
      log: path.join(dir, 'provider.jsonl'),
      output: path.join(dir, 'worker.log'),
    };
    mkdirSync(files.markers);
    writeFileSync(files.log, '');
    writePlan();
    // Bundled once here: each worker process then starts in seconds.
    const bundle = await workflowBundle();
    writeFileSync(files.bundle, JSON.stringify(bundle));
    const connection = await Connection.connect({ address: process.env.TEMPORAL_ADDRESS });
    client = new StasisClient(new Client({ connection, namespace: process.env.TEMPORAL_NAMESPACE ?? 'default' }), {
      taskQueue,
    });
    worker = await spawnWorker();
  }, 180_000);

  afterAll(async () => {
    if (worker && worker.exitCode === null) await sigkill(worker);
    for (const sandboxId of (await scanSandboxProcesses(hostId)).keys())
      await killSandbox({ hostId, sandboxId }).catch(() => undefined);
    await client?.close();
  });

  function writePlan(): void {
    writeFileSync(files.plan, JSON.stringify(plan));
  }

  /** Starts the worker process and waits until it polls. */
  async function spawnWorker(): Promise<ChildProcess> {
    const output = openSync(files.output, 'a');
    const child = spawn(
      process.execPath,
      ['-r', path.join(ROOT, 'scripts', 'register-ts.js'), path.join(__dirname, 'kill-worker.ts')],
      {
        cwd: ROOT,
        env: {
          ...process.env,
          STASIS_TASK_QUEUE: taskQueue,
          STASIS_DATA_DIR: dataDir,
          STASIS_HOST_ID: hostId,
          KILL_BUNDLE: files.bundle,
          KILL_PLAN: files.plan,
          KILL_MARKERS: files.markers,
          KILL_LOG: files.log,
        },
        stdio: ['ignore', 'pipe', output],
      },
    );
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`worker did not start in 120 s; see ${files.output}`)), 120_000);
      child.stdout?.on('data', (chunk: Buffer) => {
        if (chunk.toString().includes('READY')) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(
          new Error(`worker exited (${code}) before it was ready:\n${readFileSync(files.output, 'utf8').slice(-3000)}`),
        );
      });
    });
    child.stdout?.resume();
    return child;
  }

  async function sigkill(child: ChildProcess): Promise<void> {
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  /** Kills the worker where every sandbox of `at` has stopped, and starts a new one on the same data dir and host. */
  async function killAndRestart(at: { sandboxId: string; point: KillPoint }[]): Promise<void> {
    await eventually(
      async () => at.every(({ sandboxId, point }) => existsSync(path.join(files.markers, `${sandboxId}@${point}`))),
      180_000,
      'every call stopped at its point',
    );
    await sigkill(worker!);
    kills += 1;
    tally.inject(at.length);
    worker = await spawnWorker();
  }

  interface LogEntry {
    event: string;
    sandboxId: string;
    pid: number;
    duplicate?: boolean;
    uri?: string;
    source?: string;
    key?: string;
  }
  const logEntries = (): LogEntry[] =>
    readFileSync(files.log, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as LogEntry);

  /** Multipart uploads still open for the keys this sandbox's mid-upload stops used (MinIO lists them by exact key only). */
  async function unfinishedUploads(sandboxId: string): Promise<number> {
    let count = 0;
    for (const entry of logEntries().filter((e) => e.event === 'stopped' && e.sandboxId === sandboxId && e.key)) {
      const uploads = await s3.send(
        new ListMultipartUploadsCommand({ Bucket: process.env.STASIS_S3_BUCKET, Prefix: entry.key }),
      );
      count += (uploads.Uploads ?? []).filter((u) => u.Key === entry.key).length;
    }
    return count;
  }

  /**
   * The uploads a sandbox's mid-upload stop left on the wire: a multipart upload open under a tar.gz key, or a
   * pack whose PutObject was cut part-way (the store has no object under its key).
   */
  async function uploadsInFlight(sandboxId: string): Promise<number> {
    let count = await unfinishedUploads(sandboxId);
    for (const entry of logEntries().filter((e) => e.event === 'stopped' && e.sandboxId === sandboxId && e.key)) {
      if (!entry.key!.endsWith('.pack')) continue;
      const stored = await s3
        .send(new HeadObjectCommand({ Bucket: process.env.STASIS_S3_BUCKET, Key: entry.key }))
        .then(
          () => true,
          () => false,
        );
      if (!stored) count += 1;
    }
    return count;
  }

  const sandboxRoot = (sandboxId: string) => path.join(dataDir, 'hosts', hostId, 'sandboxes', sandboxId);
  const processCount = async (sandboxId: string) => (await sandboxProcesses({ sandboxId, hostId })).length;

  interface KillRun {
    runId: string;
    sandboxId: string;
    releasePoint: KillPoint;
    restorePoint: KillPoint;
  }

  test(`SIGKILL of the worker at ${RELEASE_POINTS.length} points of release and ${RESTORE_POINTS.length} of restore: every Run ends consistent`, async () => {
    const stamp = Date.now().toString(36);
    const runs: KillRun[] = Array.from({ length: RUNS }, (_, i) => {
      const runId = `faults-kill-${provider}-${i}-${stamp}`;
      return {
        runId,
        sandboxId: `${runId}-sbx`,
        releasePoint: RELEASE_POINTS[i % RELEASE_POINTS.length],
        restorePoint: RESTORE_POINTS[i % RESTORE_POINTS.length],
      };
    });
    for (const run of runs) plan[run.sandboxId] = run.releasePoint;
    writePlan();
    for (const run of runs) {
      tally.start(`${run.runId} ${run.releasePoint}`, `${run.runId}: killed at ${run.releasePoint}`);
      const blobBytes = run.releasePoint === 'release:mid-upload' ? LARGE_BLOB : 65_536;
      await client.runs.start({ ...cycleSpec(run.runId, 'killable', { blobBytes }), runId: run.runId });
    }

    // Kill 1: every release stopped at its point; the mid-upload ones with an upload on the wire.
    await eventually(
      async () => runs.every((r) => existsSync(path.join(files.markers, `${r.sandboxId}@${r.releasePoint}`))),
      180_000,
      'releases at their points',
    );
    for (const run of runs.filter((r) => r.releasePoint === 'release:mid-upload')) {
      await eventually(
        async () => (await uploadsInFlight(run.sandboxId)) > 0,
        30_000,
        `${run.sandboxId}: upload in progress`,
      );
    }
    await killAndRestart(runs.map((r) => ({ sandboxId: r.sandboxId, point: r.releasePoint })));

    for (const run of runs) {
      const view = await eventually(
        async () => {
          const v = saw(await client.runs.resource(run.runId));
          return v.record.state === 'RELEASED' ? v : undefined;
        },
        180_000,
        `${run.runId} released after the kill at ${run.releasePoint}`,
      );
      const releases = logEntries().filter((e) => e.event === 'release' && e.sandboxId === run.sandboxId);
      const what = { run: run.runId, point: run.releasePoint };
      // Released exactly once: one real release (a retry after it is a duplicate), one receipt on disk.
      expect({ ...what, released: releases.filter((e) => !e.duplicate).length }).toEqual({ ...what, released: 1 });
      expect({
        ...what,
        receipts: readdirSync(path.join(sandboxRoot(run.sandboxId), 'meta', 'receipts')).length,
      }).toEqual({ ...what, receipts: 1 });
      expect(view.record.checkpoint?.uri).toBe(releases.find((e) => !e.duplicate)?.uri);
      // The retry replaced what the killed attempt left: one object, the receipt's, and no open upload.
      expect({ ...what, keys: await checkpointKeys(s3, run.sandboxId) }).toEqual({
        ...what,
        keys: [view.record.checkpoint!.uri.replace(/^s3:\/\/[^/]+\//, '')],
      });
      expect({ ...what, unfinished: await unfinishedUploads(run.sandboxId) }).toEqual({ ...what, unfinished: 0 });
      // No process left; the checkpoint is there and verifies; the interaction still waits.
      expect({ ...what, processes: await processCount(run.sandboxId) }).toEqual({ ...what, processes: 0 });
      expect(await checkpointVerifies(s3, view.record.checkpoint!)).toBe(true);
      const snapshot = await client.runs.get(run.runId);
      expect(snapshot).toMatchObject({ status: 'WAITING', interactions: [{ id: 'int-1', status: 'pending' }] });
      tally.ok(`${run.runId} ${run.releasePoint}`);
    }
    // The restarted worker finished every release: the interrupted ones for real, the one killed after terminate as a duplicate.
    expect(logEntries().filter((e) => e.event === 'release' && e.pid === worker!.pid)).toHaveLength(RUNS);

    // Kill 2: every restore stopped at its point, after the answer.
    for (const run of runs) plan[run.sandboxId] = run.restorePoint;
    writePlan();
    for (const run of runs) {
      tally.start(`${run.runId} ${run.restorePoint}`, `${run.runId}: killed at ${run.restorePoint}`);
      await expect(client.runs.respond(run.runId, 'int-1', { decision: 'approve' })).resolves.toMatchObject({
        status: 'answered',
      });
    }
    await killAndRestart(runs.map((r) => ({ sandboxId: r.sandboxId, point: r.restorePoint })));

    await Promise.all(
      runs.map(async (run) => {
        await expect(client.temporal.workflow.getHandle(run.runId).result()).resolves.toEqual({ tag: run.runId });
        const events = await historyEvents(client.temporal, run.runId);
        expect(failedWorkflowTasks(events)).toEqual([]);
        // The workspace after the resume is byte for byte the one before the suspension.
        expect({ run: run.runId, intact: workspaceIntact(events) }).toEqual({ run: run.runId, intact: true });
        expect(await processCount(run.sandboxId)).toBe(0);
        tally.ok(`${run.runId} ${run.restorePoint}`);
      }),
    );
    // Nothing the dead workers started is still running on the host.
    expect([...(await scanSandboxProcesses(hostId)).keys()]).toEqual([]);

    // The completed Runs destroyed their sandboxes, and with them every checkpoint.
    let left = 0;
    let unfinished = 0;
    for (const run of runs) {
      left += (await storedKeys(s3, run.sandboxId)).length;
      unfinished += await unfinishedUploads(run.sandboxId);
    }
    leftInStore = { left, unfinished };
    expect(leftInStore).toEqual({ left: 0, unfinished: 0 });
  }, 900_000);

  test('summary: every Run consistent after the kills, nothing lost', () => {
    writeSummary(area, tally, {
      kills,
      runs: RUNS,
      release_points: RELEASE_POINTS.length,
      restore_points: RESTORE_POINTS.length,
      checkpoints_left_in_store: leftInStore.left,
      unfinished_multipart_uploads: leftInStore.unfinished,
    });
    expect(tally.lostItems).toEqual([]);
    expect(tally.trials).toBe(2 * RUNS);
    expect(kills).toBe(2);
  });
}
