import { readFileSync } from 'node:fs';
import * as os from 'node:os';
import { spawnerPid, startProcess, type SpawnRequest } from '../../providers/spawner';

// The helper process that starts sandbox processes for the worker: real forks,
// real processes, their parent checked in /proc.

const request = (args: string[], extra: Partial<SpawnRequest> = {}): SpawnRequest => ({
  file: '/bin/sh',
  args: ['-c', ...args],
  cwd: os.tmpdir(),
  env: { PATH: '/usr/bin:/bin', ONLY_THIS: 'yes' },
  background: false,
  maxOutputBytes: 1024,
  ...extra,
});

function parentOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
}

test('a foreground process runs as a child of the helper, with exactly the environment it was given', async () => {
  process.env.STASIS_SPAWNER_TEST_LEAK = 'worker-only';
  const started = await startProcess(request(['sleep 0.2; env; echo err >&2; exit 3']));
  const helper = spawnerPid();
  expect(helper).toBeDefined();
  expect(helper).not.toBe(process.pid);
  expect(parentOf(started.pid)).toBe(helper);
  const exit = await started.exited;
  expect(exit).toMatchObject({ code: 3, signal: null, stderr: 'err\n' });
  expect(exit.stdout).toContain('ONLY_THIS=yes');
  expect(exit.stdout).not.toContain('STASIS_SPAWNER_TEST_LEAK');
});

test('output beyond the cap is dropped and said so; a kill is reported as the signal', async () => {
  const big = await (await startProcess(request(['head -c 5000 /dev/zero | tr "\\0" a']))).exited;
  expect(big.stdout.startsWith('a'.repeat(1024))).toBe(true);
  expect(big.stdout).toContain('[stasis: output truncated after 1024 bytes, 3976 more dropped]');
  const sleeper = await startProcess(request(['sleep 30']));
  process.kill(-sleeper.pid, 'SIGKILL'); // its own process group
  expect(await sleeper.exited).toMatchObject({ code: null, signal: 'SIGKILL' });
});

test('a command that cannot start is refused with the reason', async () => {
  await expect(startProcess(request([], { file: '/nonexistent/tool' }))).rejects.toMatchObject({
    code: 'INTERNAL',
    message: expect.stringContaining('could not start /nonexistent/tool: spawn /nonexistent/tool ENOENT'),
  });
});

test('when the helper dies, waiting callers fail with why and the next start uses a new helper', async () => {
  const running = await startProcess(request(['sleep 30']));
  const first = spawnerPid() as number;
  process.kill(first, 'SIGKILL');
  await expect(running.exited).rejects.toMatchObject({
    code: 'INTERNAL',
    message: expect.stringContaining('the process starter exited (SIGKILL)'),
  });
  process.kill(-running.pid, 'SIGKILL'); // its process outlived the helper, as a sandbox's does
  const again = await startProcess(request(['echo again']));
  expect(spawnerPid()).not.toBe(first);
  expect((await again.exited).stdout).toBe('again\n');
});

test('a background process is reported started and left running', async () => {
  const started = await startProcess(request(['sleep 30'], { background: true }));
  expect(parentOf(started.pid)).toBe(spawnerPid());
  process.kill(-started.pid, 'SIGKILL');
});
