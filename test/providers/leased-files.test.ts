import { spawn } from 'node:child_process';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createBwrapProvider } from '../../providers/bwrap';
import { sandboxPaths } from '../../providers/sandbox-state';
import { packSandbox } from '../../stores/archive';
import { LeaseWaits, readWhole, walkSandbox, walkSandboxSync, type WalkEntry } from '../../stores/walk';
import { context, s3StoreFromEnv, stasisError, tempDir, uniqueId, waitFor } from './helpers';
import { makeHost, sh } from './harness';

// A sandbox process may hold a lease on a file it owns (fcntl F_SETLEASE): any other open of the file
// then blocks, or with O_NONBLOCK fails with EAGAIN, until the holder lets go or the kernel breaks the
// lease (after /proc/sys/fs/lease-break-time, 45 s by default), whatever the holder does. A hostile
// holder that never lets go and takes its lease again whenever it can must not keep a release from
// checkpointing the file (it failed every attempt, so the sandbox's compute was never released), nor
// hang a file read. Real processes, a real lease, restored from the real store on another host.

const LEASE_BREAK = '/proc/sys/fs/lease-break-time';
/** Seconds the kernel gives a holder here (lowered for the test; restored after). */
const BREAK_S = 2;
let breakBefore: string;

beforeAll(() => {
  breakBefore = readFileSync(LEASE_BREAK, 'utf8').trim();
  writeFileSync(LEASE_BREAK, String(BREAK_S));
});

afterAll(() => {
  writeFileSync(LEASE_BREAK, breakBefore);
});

/**
 * Starts a process in the sandbox that takes a write lease on `file` (in the workspace), ignores the
 * kernel's SIGIO, and takes the lease again every 20 ms when it can; resolves once it holds it.
 */
async function holdLease(provider: Parameters<typeof sh>[0], sandboxId: string, file: string): Promise<void> {
  const script = [
    'import fcntl, os, signal, time',
    'signal.signal(signal.SIGIO, signal.SIG_IGN)',
    `fd = os.open(${JSON.stringify(file)}, os.O_WRONLY)`,
    'fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)',
    "open('lease-taken', 'w').close()",
    'while True:',
    '    time.sleep(0.02)',
    '    try: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)',
    '    except OSError: pass',
  ].join('\n');
  await fs.writeFile(path.join(workspaceOf(provider, sandboxId), 'hold.py'), script);
  await sh(provider, sandboxId, 'nohup python3 hold.py >/dev/null 2>&1 &');
  await waitFor('the lease to be taken', async () =>
    fs.access(path.join(workspaceOf(provider, sandboxId), 'lease-taken')).then(
      () => true,
      () => false,
    ),
  );
}

const dataDirs = new Map<Parameters<typeof sh>[0], string>();
const workspaceOf = (provider: Parameters<typeof sh>[0], sandboxId: string) =>
  sandboxPaths(dataDirs.get(provider)!, sandboxId).workspace;

it.each([
  ['local', undefined],
  ['bwrap', (deps: Parameters<typeof createBwrapProvider>[0]) => createBwrapProvider(deps)],
])(
  'a %s release checkpoints a file a sandbox process keeps leased, and another host restores it',
  async (_name, make) => {
    const store = s3StoreFromEnv();
    const hostA = await makeHost({ store, ...(make ? { make } : {}) });
    const hostB = await makeHost({ store, ...(make ? { make } : {}) });
    dataDirs.set(hostA.provider, hostA.dataDir);
    const sandboxId = await hostA.sandbox();
    const content = `leased ${uniqueId('content')}\n`;
    await fs.writeFile(path.join(workspaceOf(hostA.provider, sandboxId), 'leased.txt'), content);
    await holdLease(hostA.provider, sandboxId, 'leased.txt');

    const receipt = await hostA.provider.release(
      { sandboxId, idempotencyKey: uniqueId('rel'), mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    expect(await hostA.provider.processCount(sandboxId)).toBe(0);
    if (!receipt.checkpoint) throw new Error('no checkpoint');
    await hostB.provider.restore({ sandboxId, fence: 3, checkpoint: receipt.checkpoint }, context());
    const restored = sandboxPaths(hostB.dataDir, sandboxId).workspace;
    expect(await fs.readFile(path.join(restored, 'leased.txt'), 'utf8')).toBe(content);
    await hostB.provider.destroy({ sandboxId, fence: 4 }, context());
  },
);

it('reading a leased file is UNAVAILABLE naming it (never a wait for the kernel to break the lease), and reads once the holder is gone', async () => {
  const host = await makeHost();
  dataDirs.set(host.provider, host.dataDir);
  const sandboxId = await host.sandbox();
  await fs.writeFile(path.join(workspaceOf(host.provider, sandboxId), 'leased.txt'), 'mine\n');
  await holdLease(host.provider, sandboxId, 'leased.txt');
  const err = await stasisError(host.provider.readFile({ sandboxId, path: 'leased.txt' }, context()), 'UNAVAILABLE');
  expect(err.message).toContain('leased.txt');
  expect(err.message).toContain('lease');
  await sh(host.provider, sandboxId, 'pkill -f hold.py; true');
  await waitFor('the holder to be gone', async () =>
    host.provider.readFile({ sandboxId, path: 'leased.txt' }, context()).then(
      (got) => got.toString() === 'mine\n',
      () => false,
    ),
  );
});

/** A process outside any sandbox holding write leases on `files`, stopped as a release's freeze stops one. */
async function stoppedHolder(files: string[]): Promise<{ pid: number; end(): void }> {
  const script = [
    'import fcntl, os, signal, sys, time',
    'signal.signal(signal.SIGIO, signal.SIG_IGN)',
    'fds = [os.open(f, os.O_WRONLY) for f in sys.argv[1:]]',
    'for fd in fds: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)',
    "print('ready', flush=True)",
    'time.sleep(120)',
  ].join('\n');
  const child = spawn('python3', ['-c', script, ...files], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
  process.kill(child.pid!, 'SIGSTOP');
  return { pid: child.pid!, end: () => child.kill('SIGKILL') };
}

/**
 * The status (ACTIVE, BREAKING, ...) of each lease process `pid` holds on `files`, by file, from
 * /proc/locks. That file is read in pages and other processes' locks come and go between pages, so one
 * read can show a lease twice or not at all: it is read again (a few times) until it shows every file.
 */
function leaseStatuses(pid: number, files: string[]): Record<string, string> {
  const byInode = new Map(files.map((file) => [String(statSync(file).ino), file]));
  let statuses: Record<string, string> = {};
  for (let attempt = 0; attempt < 10; attempt += 1) {
    statuses = {};
    for (const fields of readFileSync('/proc/locks', 'utf8')
      .split('\n')
      .map((line) => line.split(/\s+/))) {
      if (fields[1] !== 'LEASE' || fields[4] !== String(pid)) continue;
      const inode = fields[5].split(':')[2];
      statuses[byInode.get(inode) ?? `inode ${inode}`] = fields[2];
    }
    if (Object.keys(statuses).length === files.length) break;
  }
  return statuses;
}

/** `files`, each with `status`. */
function each(files: string[], status: string): Record<string, string> {
  return Object.fromEntries(files.map((file) => [file, status]));
}

it.each([
  ['synchronous walk (content-addressed checkpoints)', true],
  ['asynchronous walk (tar.gz checkpoints)', false],
])(
  'the %s asks every lease to break at the first leased file, and reads every leased file after one break time',
  async (_name, sync) => {
    const root = await tempDir('leases');
    for (const name of ['workspace', 'home', 'envs']) await fs.mkdir(path.join(root, name));
    const expected: Record<string, string> = {};
    const files: string[] = [];
    for (let i = 0; i < 12; i += 1) {
      const relative = `workspace/d${i % 3}/f${i}.txt`;
      await fs.mkdir(path.dirname(path.join(root, relative)), { recursive: true });
      await fs.writeFile(path.join(root, relative), `file ${i}\n`);
      expected[relative] = `file ${i}\n`;
      files.push(path.join(root, relative));
    }
    const holder = await stoppedHolder(files);
    try {
      expect(leaseStatuses(holder.pid, files)).toEqual(each(files, 'ACTIVE'));
      const read: Record<string, string> = {};
      const take = (entry: WalkEntry) => {
        if (entry.kind === 'file' && entry.file !== undefined)
          read[entry.path] = readWhole(entry.file, Number(entry.stat.size), entry.path).toString();
      };
      let leasedSeen = 0;
      if (sync) {
        const leases = new LeaseWaits(root, ['workspace', 'home', 'envs']);
        for (const entry of await walkSandboxSync(root, ['workspace', 'home', 'envs'])) {
          if (entry.kind === 'leased') {
            leasedSeen += 1;
            await leases.wait(entry.path);
            // After the first wait began: every break asked for, so they all run out together.
            if (leasedSeen === 1) expect(leaseStatuses(holder.pid, files)).toEqual(each(files, 'BREAKING'));
          } else take(entry);
        }
        expect(leasedSeen).toBeGreaterThan(0);
      } else {
        for await (const entry of walkSandbox(root, ['workspace', 'home', 'envs'])) {
          expect(entry.kind).not.toBe('leased');
          take(entry);
        }
      }
      expect(read).toEqual(expected);
    } finally {
      holder.end();
    }
  },
);

it('a lease the kernel has not broken past its break time and a margin is UNAVAILABLE naming the file', async () => {
  const leases = new LeaseWaits('/nonexistent', [], 0);
  const started = Date.now();
  let err: unknown;
  while (err === undefined) await leases.wait('workspace/held.txt').catch((e: unknown) => (err = e));
  expect(err).toMatchObject({ code: 'UNAVAILABLE' });
  expect((err as Error).message).toContain('workspace/held.txt');
  expect(Date.now() - started).toBeGreaterThanOrEqual(2_000);
});

it('a tar.gz checkpoint cancelled while it waits for a lease to break stops there (it went on to pack the file)', async () => {
  const root = await tempDir('leases-abort');
  for (const name of ['workspace', 'home', 'envs']) await fs.mkdir(path.join(root, name));
  const file = path.join(root, 'workspace', 'held.txt');
  await fs.writeFile(file, 'held\n');
  const holder = await stoppedHolder([file]);
  try {
    const controller = new AbortController();
    const packed = packSandbox(root, ['workspace', 'home', 'envs'], controller.signal);
    const read = (async () => {
      for await (const _chunk of packed);
    })();
    await waitFor('the walk to wait for the lease', async () => leaseStatuses(holder.pid, [file])[file] === 'BREAKING');
    controller.abort();
    await expect(read).rejects.toMatchObject({ name: 'AbortError' });
  } finally {
    holder.end();
  }
});
