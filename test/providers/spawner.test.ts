import fc from 'fast-check';
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
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

test('a background process is reported started and left running, with its start time', async () => {
  const started = await startProcess(request(['sleep 30'], { background: true }));
  expect(parentOf(started.pid)).toBe(spawnerPid());
  // Field 22 of its stat: what tells this process from a later one given the same pid.
  const stat = readFileSync(`/proc/${started.pid}/stat`, 'utf8');
  expect(started.startTime).toBe(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
  process.kill(-started.pid, 'SIGKILL');
});

describe('a hostile request never takes the starter down', () => {
  // Each of these threw synchronously inside the starter's spawn() and killed it, failing every
  // process in flight on the host (their jobs became JOB_INTERRUPTED).
  const hostile: [string, Partial<SpawnRequest>, RegExp][] = [
    ['a NUL byte in the file', { file: '/bin/sh\0x' }, /file.*NUL/],
    ['a NUL byte in an argument', { args: ['-c', 'echo a\0b'] }, /args\[1\].*NUL/],
    ['a NUL byte in an environment value', { env: { A: 'x\0y' } }, /env\.A.*NUL/],
    ['a NUL byte in an environment name', { env: { 'A\0B': 'x' } }, /env.*name.*NUL/],
    ['a NUL byte in the working directory', { cwd: '/tmp\0' }, /cwd.*NUL/],
    ['an argument over 128 KiB', { args: ['-c', `echo ${'a'.repeat(200 * 1024)}`] }, /args\[1\].*too long/],
    ['an environment value over 128 KiB', { env: { BIG: 'b'.repeat(200 * 1024) } }, /env\.BIG.*too long/],
  ];
  it.each(hostile)('%s is refused as INVALID_ARGUMENT; a neighbour keeps running', async (_what, extra, message) => {
    const neighbour = await startProcess(request(['sleep 0.5; echo neighbour-done']));
    const starter = spawnerPid();
    await expect(startProcess(request(['true'], extra))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(message),
    });
    expect(await neighbour.exited).toMatchObject({ code: 0, stdout: 'neighbour-done\n' });
    expect(spawnerPid()).toBe(starter);
  });

  it('a long script goes in on stdin, past any argv limit', async () => {
    const script = `x=${'a'.repeat(512 * 1024)}\necho \${#x}`;
    const exit = await (
      await startProcess({ ...request([]), args: ['-c', 'eval "$(/bin/cat)"'], stdin: script })
    ).exited;
    expect(exit).toMatchObject({ code: 0, stdout: `${512 * 1024}\n` });
  });
});

test('bytes given as fd3 are read on descriptor 3 up to end of file, by foreground and background processes', async () => {
  const bytes = Buffer.from([0, 1, 2, 255, 10, 0x20]); // bwrap's seccomp program is binary
  const exit = await (await startProcess(request(['od -An -tu1 <&3'], { fd3: bytes }))).exited;
  expect(exit.code).toBe(0);
  expect(exit.stdout.trim().split(/\s+/)).toEqual(['0', '1', '2', '255', '10', '32']);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'fd3-'));
  const out = path.join(dir, 'out');
  await startProcess(request([`cat <&3 > ${out}.tmp && mv ${out}.tmp ${out}`], { background: true, fd3: bytes }));
  for (let i = 0; i < 500 && !existsSync(out); i += 1) await new Promise((resolve) => setTimeout(resolve, 10));
  expect(readFileSync(out)).toEqual(bytes);
});

describe('the starter’s wire protocol, spoken directly', () => {
  // Straight to the helper over its IPC channel, past every check on the worker's side.
  let helper: ChildProcess;
  const replies: unknown[] = [];
  beforeAll(() => {
    helper = fork(require.resolve('../../providers/spawner-main'), [], {
      execArgv: ['-r', path.resolve(__dirname, '..', '..', 'scripts', 'register-ts.js')],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      serialization: 'advanced',
    });
    helper.on('message', (m) => replies.push(m));
  });
  afterAll(() => helper.kill('SIGKILL'));

  const replyTo = async (id: number, kind: string) => {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const found = replies.find(
        (r) => (r as { id?: unknown; kind?: unknown }).id === id && (r as { kind: unknown }).kind === kind,
      );
      if (found) return found;
      if (helper.exitCode !== null || helper.signalCode !== null)
        throw new Error(`the starter died (${helper.exitCode ?? helper.signalCode})`);
      if (Date.now() > deadline) throw new Error(`no ${kind} reply to ${id}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  };
  const good = (id: number) => ({ ...request(['echo ok']), id });

  it('answers garbage with a failure, or ignores it when it carries no id, and keeps serving', async () => {
    const garbage: unknown[] = [
      null,
      42,
      'spawn',
      [],
      {},
      { id: 'x' },
      { id: 1 },
      { ...good(2), file: 7 },
      { ...good(3), args: 'not-an-array' },
      { ...good(4), args: [1, 2] },
      { ...good(5), env: null },
      { ...good(6), env: { A: 1 } },
      { ...good(7), env: { 'A=B': 'x' } },
      { ...good(8), cwd: undefined },
      { ...good(9), maxOutputBytes: -1 },
      { ...good(10), background: 'yes' },
      { ...good(11), file: '/bin/sh\0' },
      { ...good(12), args: ['-c', 'x'.repeat(300 * 1024)] },
      { ...good(13), env: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`V${i}`, 'v'.repeat(100 * 1024)])) },
      { ...good(14), stdin: 5 },
      { ...good(15), cwd: '/nonexistent-dir' },
      { ...good(16), fd3: 'not bytes' },
    ];
    for (const message of garbage) helper.send(message as never);
    for (let id = 1; id <= 16; id += 1) await replyTo(id, 'failed');
    helper.send(good(100));
    await replyTo(100, 'spawned');
    expect(await replyTo(100, 'exited')).toMatchObject({ exit: { code: 0, stdout: 'ok\n' } });
  });
});

test('property: descriptors the worker inherited without close-on-exec never reach a started process', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'spawner-fds-'));
  await fc.assert(
    fc.asyncProperty(fc.uniqueArray(fc.integer({ min: 4, max: 300 }), { minLength: 1, maxLength: 3 }), async (fds) => {
      // Each a file of its own, at its number in the child, as a shell's `exec N>file` would leave it.
      const stdio: (number | 'ignore' | 'pipe')[] = ['ignore', 'pipe', 'pipe'];
      const files = fds.map((fd) => {
        const file = path.join(dir, `inherited-${fd}`);
        const opened = openSync(file, 'w');
        stdio[fd] = opened;
        return { file, opened };
      });
      for (let i = 3; i < stdio.length; i++) stdio[i] ??= 'ignore';
      try {
        const child = spawn(
          process.execPath,
          [
            '-r',
            path.resolve(__dirname, '..', '..', 'scripts', 'register-ts.js'),
            path.join(__dirname, 'fd-leak-child.ts'),
          ],
          { stdio },
        );
        let out = '';
        child.stdout!.on('data', (chunk: Buffer) => (out += chunk.toString()));
        child.stderr!.resume();
        const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
        expect(code).toBe(0);
        const [own, started] = out.split('\n');
        // The worker had them (the test is real), the process it started has none of them.
        for (const { file } of files) {
          expect(own.split(' ')).toContain(file);
          expect(started.split(' ')).not.toContain(file);
        }
        expect(started).not.toContain(dir);
        // Nothing but its stdio (the glob's listing of the directory is closed before the loop reads).
        expect(started.split(' ').filter(Boolean)).toHaveLength(3);
      } finally {
        for (const { opened } of files) closeSync(opened);
      }
    }),
    { numRuns: 4 },
  );
}, 120_000);
