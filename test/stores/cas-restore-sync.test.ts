import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createLocalProvider } from '../../providers/local';
import { sandboxPaths } from '../../providers/sandbox-state';
import { killSandbox, sandboxProcesses } from '../../providers/processes';
import type * as Spawner from '../../providers/spawner';
import { restoreStages } from '../../stores/cas/restore';
import { context, s3StoreFromEnv, uniqueId, tempDir } from '../providers/helpers';
import { RACY_MARGIN_NS, nowNs } from '../../stores/cas/baseline';
import { newSandboxRoot, restoreFresh, take } from './cas-helpers';

// A cross-host restore starts the sandbox while its files are synced (issue 16). A sync that fails
// fails the restore, which records nothing; the compute started meanwhile must not outlive it: a
// process left running with no state is not killed by the retry (a new sandbox has no state to
// terminate), and the retry then adopts it, running on the tree the retry swapped out.
// Real MinIO, real processes; the fault is the `sync -f` process itself exiting non-zero.

const store = s3StoreFromEnv(5 * 1024 * 1024);

/** While set, the product's own `sync -f` runs as a real process that fails as an I/O error would. */
let syncFails = false;
/** Set, the next `sync -f` alone fails so (and clears it). */
let nextSyncFails = false;
jest.mock('../../providers/spawner', () => {
  const actual = jest.requireActual<typeof Spawner>('../../providers/spawner');
  return {
    ...actual,
    startProcess: (request: Spawner.SpawnRequest) => {
      const fails = request.file === 'sync' && (syncFails || nextSyncFails);
      if (fails) nextSyncFails = false;
      return actual.startProcess(fails ? { ...request, file: 'sh', args: ['-c', 'echo EIO >&2; exit 1'] } : request);
    },
  };
});

test('a sync that fails after the sandbox started leaves no compute running; the retry starts its own', async () => {
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('sync-fails');
  await fs.writeFile(path.join(root, 'workspace', 'a.txt'), 'restored\n');
  const { checkpoint } = await take(store, root, sandboxId);

  const dataDir = await tempDir('cas-restore-sync');
  const hostId = uniqueId('host');
  const provider = createLocalProvider({ hostId, dataDir, store });
  const ctx = context({ hostId, ownerId: sandboxId });
  const marker = { sandboxId, hostId };
  syncFails = true;
  try {
    await expect(provider.restore({ sandboxId, fence: 2, checkpoint }, ctx)).rejects.toThrow(/sync -f .* failed/);
  } finally {
    syncFails = false;
  }
  expect(await sandboxProcesses(marker)).toEqual([]);

  await provider.restore({ sandboxId, fence: 2, checkpoint }, ctx);
  expect((await sandboxProcesses(marker)).length).toBeGreaterThan(0);
  await killSandbox(marker);
}, 120_000);

test('a worker killed after the sandbox started but before the state recorded the restore: the retry kills the orphan and starts its own', async () => {
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('orphan');
  await fs.writeFile(path.join(root, 'workspace', 'a.txt'), 'restored\n');
  const { checkpoint } = await take(store, root, sandboxId);
  const dataDir = await tempDir('cas-restore-orphan');
  const hostId = uniqueId('host');
  const ctx = context({ hostId, ownerId: sandboxId });
  const marker = { sandboxId, hostId };
  await createLocalProvider({ hostId, dataDir, store }).restore({ sandboxId, fence: 2, checkpoint }, ctx);
  const orphans = (await sandboxProcesses(marker)).map((p) => p.pid);
  expect(orphans.length).toBeGreaterThan(0);
  // What such a kill leaves of a sandbox new to this host: its files swapped in, its compute running, no state
  // (the state is written first after the sync, which runs while the compute starts).
  await fs.rm(sandboxPaths(dataDir, sandboxId).stateFile);

  // The retry, by another worker of the same host.
  await createLocalProvider({ hostId, dataDir, store }).restore({ sandboxId, fence: 2, checkpoint }, ctx);
  const running = (await sandboxProcesses(marker)).map((p) => p.pid);
  expect(running.length).toBeGreaterThan(0);
  expect(running.filter((pid) => orphans.includes(pid))).toEqual([]);
  await killSandbox(marker);
}, 120_000);

test('a flush that fails while the files are written fails the restore, though the sync at its end succeeds', async () => {
  // A later syncfs (another descriptor) does not report a writeback error from before it was opened:
  // a flush's failure, lost, would leave files that are not on disk recorded as restored.
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('flush-fails');
  // Enough files for the writer to flush while it writes (restore.ts, FLUSH_FILES).
  for (let i = 0; i < 3000; i += 1) await fs.writeFile(path.join(root, 'workspace', `f${i}.txt`), `file ${i}\n`);
  const { checkpoint } = await take(store, root, sandboxId);

  const dataDir = await tempDir('cas-restore-flush');
  const hostId = uniqueId('host');
  const provider = createLocalProvider({ hostId, dataDir, store });
  const ctx = context({ hostId, ownerId: sandboxId });
  const marker = { sandboxId, hostId };
  const stages: string[] = [];
  const onStage = (message: unknown) => {
    const { stage } = message as { stage: string };
    stages.push(stage);
    // The first flush's own `sync -f` fails; every other succeeds.
    if (stage === 'flush started' && stages.filter((s) => s === stage).length === 1) nextSyncFails = true;
  };
  subscribe(restoreStages.name, onStage);
  try {
    await expect(provider.restore({ sandboxId, fence: 2, checkpoint }, ctx)).rejects.toThrow(/sync -f .* failed/);
  } finally {
    unsubscribe(restoreStages.name, onStage);
    nextSyncFails = false;
  }
  expect(stages).toContain('flush started');
  expect(await sandboxProcesses(marker)).toEqual([]);

  await provider.restore({ sandboxId, fence: 2, checkpoint }, ctx);
  const workspace = sandboxPaths(dataDir, sandboxId).workspace;
  expect((await fs.readdir(workspace)).length).toBe(3000);
  expect(await fs.readFile(path.join(workspace, 'f2999.txt'), 'utf8')).toBe('file 2999\n');
  await killSandbox(marker);
}, 120_000);

test("a restore returns only past its files' racy window (the sandbox started meanwhile); a same-size change by the first command is in the next checkpoint", async () => {
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('racy-start');
  for (let i = 0; i < 300; i += 1) await fs.writeFile(path.join(root, 'workspace', `f${i}.txt`), `before ${i}\n`);
  const { checkpoint } = await take(store, root, sandboxId);

  const dataDir = await tempDir('cas-restore-racy');
  const hostId = uniqueId('host');
  const provider = createLocalProvider({ hostId, dataDir, store });
  const ctx = context({ hostId, ownerId: sandboxId });
  const stages: string[] = [];
  const onStage = (message: unknown) => stages.push((message as { stage: string }).stage);
  subscribe(restoreStages.name, onStage);
  // The worker's clock behind the filesystem's by 150 ms (within what a restore waits for): its racy window
  // then lasts ~200 ms, far longer than the sync and the start, so a return that did not wait for it shows.
  const realNow = Date.now.bind(Date);
  const behind = jest.spyOn(Date, 'now').mockImplementation(() => realNow() - 150);
  let returnedNs: bigint;
  try {
    await provider.restore({ sandboxId, fence: 2, checkpoint }, ctx);
    returnedNs = nowNs();
  } finally {
    behind.mockRestore();
    unsubscribe(restoreStages.name, onStage);
  }
  expect(stages.indexOf('racy window passed')).toBeGreaterThan(-1);
  expect(stages.indexOf('racy window passed')).toBeLessThan(stages.indexOf('sandbox started and files ready'));
  // Every restored file's last change is older than the margin: a change from now on gives it another ctime.
  const workspace = sandboxPaths(dataDir, sandboxId).workspace;
  let latest = 0n;
  for (const name of await fs.readdir(workspace)) {
    const { ctimeNs } = await fs.lstat(path.join(workspace, name), { bigint: true });
    if (ctimeNs > latest) latest = ctimeNs;
  }
  expect(latest + RACY_MARGIN_NS).toBeLessThanOrEqual(returnedNs);

  // At once: same sizes, so only the stat's times can tell the files changed.
  const changed = await provider.exec(
    { sandboxId, fence: 2, jobId: 'edit', command: 'for i in 7 299; do printf "after! $i\\n" > f$i.txt; done' },
    ctx,
  );
  expect(changed.exitCode).toBe(0);
  const receipt = await provider.release(
    { sandboxId, idempotencyKey: 'racy', mode: 'SNAPSHOT_AND_TERMINATE', fence: 3, reason: 'test' },
    ctx,
  );
  if (!receipt.checkpoint) throw new Error('no checkpoint');
  const elsewhere = await restoreFresh(store, receipt.checkpoint);
  for (const i of [7, 299]) {
    expect(await fs.readFile(path.join(elsewhere.target, 'workspace', `f${i}.txt`), 'utf8')).toBe(`after! ${i}\n`);
  }
  expect(await fs.readFile(path.join(elsewhere.target, 'workspace', 'f8.txt'), 'utf8')).toBe('before 8\n');
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
}, 120_000);
