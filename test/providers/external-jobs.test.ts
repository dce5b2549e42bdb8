import { readdirSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { hostCommands, spawnInSandbox } from '../../providers/command';
import { EXTERNAL_JOBS_DIR, runExternalJob, sweepExternalJobs } from '../../providers/external-jobs';
import { DEFAULT_LIMITS } from '../../providers/limits';
import { markerEnv } from '../../providers/processes';
import { pidsRunning, tempDir, uniqueId, waitFor } from './helpers';

// An EXTERNAL job runs the agent's command beside its sandbox. The command is as hostile as
// anything in the sandbox: it must get no more of the host than a sandbox of the Run's provider,
// never the worker's environment, and leave nothing behind.

const WORKER_SECRET = `worker-secret-${Math.random().toString(36).slice(2)}`;
let dataDir: string;
let outside: string;
const hostId = uniqueId('host-ext');

beforeAll(async () => {
  process.env.STASIS_TEST_WORKER_SECRET = WORKER_SECRET;
  dataDir = await tempDir('ext-data');
  outside = await tempDir('ext-outside');
  await fs.writeFile(path.join(outside, 'secret'), WORKER_SECRET);
  // A neighbour's workspace under the same data dir.
  await fs.mkdir(path.join(dataDir, 'sandboxes', 'sbx-neighbour', 'volume', 'workspace'), { recursive: true });
  await fs.writeFile(path.join(dataDir, 'sandboxes', 'sbx-neighbour', 'volume', 'workspace', 'notes'), WORKER_SECRET);
});

afterAll(async () => {
  delete process.env.STASIS_TEST_WORKER_SECRET;
  await fs.rm(dataDir, { recursive: true, force: true });
  await fs.rm(outside, { recursive: true, force: true });
});

const host = () => ({ hostId, dataDir });
const leftovers = async () => readdirSync(path.join(dataDir, EXTERNAL_JOBS_DIR));

describe.each(['bwrap', 'a-plugin-provider'])('a %s Run: its EXTERNAL job runs in bubblewrap', (provider) => {
  test('it sees no host file, no neighbour, no worker environment, and cannot signal the worker', async () => {
    const script = [
      `cat ${path.join(outside, 'secret')}`,
      `cat ${path.join(dataDir, 'sandboxes', 'sbx-neighbour', 'volume', 'workspace', 'notes')}`,
      'env',
      'cat /etc/shadow',
      `kill -9 ${process.pid} && echo KILLED`,
      'echo done',
    ].join('; ');
    const outcome = await runExternalJob(host(), { command: script, provider });
    expect(outcome.stdout).not.toContain(WORKER_SECRET);
    expect(outcome.stdout).not.toContain('KILLED');
    expect(outcome.stdout).not.toMatch(/^root:/m);
    expect(outcome.stdout).toContain('done');
    expect(outcome.stderr).toMatch(/No such file/);
    expect(await leftovers()).toEqual([]);
  });
});

test('a local Run’s EXTERNAL job runs as a plain process in a throwaway directory, without the worker’s environment', async () => {
  const outcome = await runExternalJob(host(), { command: 'pwd; env', provider: 'local' });
  expect(outcome.exitCode).toBe(0);
  const [cwd] = outcome.stdout.split('\n');
  expect(cwd.startsWith(path.join(dataDir, EXTERNAL_JOBS_DIR, 'ext-'))).toBe(true);
  expect(outcome.stdout).not.toContain(WORKER_SECRET);
  expect(await leftovers()).toEqual([]);
});

describe.each(['local', 'bwrap'])('%s: what a job leaves behind goes with it', (provider) => {
  test('background processes are killed and its files removed; a planted link is not followed', async () => {
    const marker = ['sleep', `7${Math.floor(Math.random() * 1e6)}`];
    await fs.writeFile(path.join(outside, 'keep'), 'kept');
    const outcome = await runExternalJob(host(), {
      command: `(${marker.join(' ')} &) ; ln -s ${outside} escape ; ln -s / root ; mkdir -p deep/er && echo x > deep/er/f ; echo started`,
      provider,
    });
    expect(outcome.stdout).toContain('started');
    expect(pidsRunning(marker)).toEqual([]);
    expect(await leftovers()).toEqual([]);
    expect(await fs.readFile(path.join(outside, 'keep'), 'utf8')).toBe('kept');
  });

  test('a job cancelled while it was starting is killed, not left running', async () => {
    const marker = ['sleep', `6${Math.floor(Math.random() * 1e6)}`];
    const abort = new AbortController();
    abort.abort(new Error('cancelled by the Run'));
    await expect(
      runExternalJob(host(), { command: `${marker.join(' ')} & wait`, provider, signal: abort.signal }),
    ).rejects.toThrow();
    expect(pidsRunning(marker)).toEqual([]);
    expect(await leftovers()).toEqual([]);
  }, 30_000);

  test('cancelling the job kills its whole process group', async () => {
    const marker = ['sleep', `8${Math.floor(Math.random() * 1e6)}`];
    const abort = new AbortController();
    const running = runExternalJob(host(), { command: `${marker.join(' ')} & wait`, provider, signal: abort.signal });
    await waitFor('the job to run', async () => pidsRunning(marker).length === 1);
    abort.abort(new Error('cancelled by the Run'));
    await expect(running).rejects.toThrow();
    expect(pidsRunning(marker)).toEqual([]);
    expect(await leftovers()).toEqual([]);
  });
});

test('exit code and output come back; a timeout kills the job', async () => {
  const ok = await runExternalJob(host(), { command: 'echo out; echo err >&2; exit 3', provider: 'bwrap' });
  expect(ok).toEqual({ exitCode: 3, stdout: 'out\n', stderr: 'err\n' });
  const slow = await runExternalJob(host(), { command: 'sleep 30', provider: 'bwrap', timeoutMs: 200 });
  expect(slow.exitCode).toBe(124);
  expect(slow.stderr).toMatch(/timed out/);
});

test('a job of a worker that died is killed and removed when the next worker starts', async () => {
  // What a killed worker leaves: the job's directory (with a link out) and its still-running process.
  const sandboxId = 'ext-left-by-a-dead-worker';
  const root = path.join(dataDir, EXTERNAL_JOBS_DIR, sandboxId);
  const paths = {
    root,
    workspace: path.join(root, 'workspace'),
    home: path.join(root, 'home'),
    envs: path.join(root, 'envs'),
  };
  for (const dir of [paths.workspace, paths.home, paths.envs]) await fs.mkdir(dir, { recursive: true });
  await fs.symlink(outside, path.join(paths.workspace, 'escape'));
  const marker = ['sleep', `9${Math.floor(Math.random() * 1e6)}`];
  const all = { ...paths, volume: root, volumeImage: root, meta: root, stateFile: root, receipts: root, jobs: root };
  await spawnInSandbox(hostCommands, all, marker, {
    env: markerEnv({ sandboxId, hostId }),
    sandbox: { marker: { sandboxId, hostId }, limits: DEFAULT_LIMITS },
    background: true,
  });
  await waitFor('the orphan to run', async () => pidsRunning(marker).length === 1);
  await sweepExternalJobs(host());
  expect(pidsRunning(marker)).toEqual([]);
  expect(await leftovers()).toEqual([]);
  expect(await fs.readFile(path.join(outside, 'secret'), 'utf8')).toBe(WORKER_SECRET);
});
