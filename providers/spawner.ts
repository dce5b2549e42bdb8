import { fork, spawn, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import type { Writable } from 'node:stream';
import { StasisError } from '../common/errors';
import { processStat } from './proc-files';

// Sandbox processes are started by a small helper process, not by the worker.
// Node's spawn forks the calling process synchronously, and the cost of a fork
// grows with the caller's memory: at the worker's 1-2 GiB (a large workflow
// cache) each start blocked its event loop for 50-85 ms, the largest share of
// the worker's main thread under load (BENCHMARKS.md). The helper stays at tens
// of MiB, so its forks stay cheap and off the worker's event loop.

/** What to start; `env` is the whole environment, the helper's own never leaks in. */
export interface SpawnRequest {
  file: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
  /** Long-lived processes are not waited for; their output goes nowhere. */
  background: boolean;
  /** Cap on each of stdout and stderr kept for a foreground process. */
  maxOutputBytes: number;
  /**
   * Written to the process's stdin, which is then closed (absent: stdin is /dev/null).
   * A command travels here rather than in argv: one argument is limited to 128 KiB.
   */
  stdin?: string;
  /**
   * Readable on descriptor 3 of the process, then end of file (absent: descriptor 3 is not open). How
   * bubblewrap gets its seccomp program (`--seccomp 3`): from memory, with no file to keep on the host.
   */
  fd3?: Uint8Array;
}

/** How a foreground process ended, with its output (each stream capped). */
export interface ProcessExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

type ToHelper = SpawnRequest & { id: number };
type FromHelper =
  | { id: number; kind: 'spawned'; pid: number; startTime: string | undefined }
  | { id: number; kind: 'failed'; code: 'INVALID_ARGUMENT' | 'INTERNAL'; message: string }
  | { id: number; kind: 'exited'; exit: ProcessExit };

export interface StartedProcess {
  pid: number;
  /**
   * Its start time as /proc/<pid>/stat gives it, read by the starter before it could reap the process
   * (undefined where /proc cannot be read): by the time the worker hears of the pid, the process may
   * have ended and the pid been handed to another.
   */
  startTime: string | undefined;
  /** Resolves when a foreground process has ended and its output is in; never for a background one. */
  exited: Promise<ProcessExit>;
}

interface Pending {
  spawned: (pid: number, startTime: string | undefined) => void;
  failed: (err: Error) => void;
  exited: (exit: ProcessExit) => void;
  lost: (err: Error) => void;
  /** The helper asked: only its own death fails the request. */
  helper: ChildProcess;
}

/** The worker's side: one helper per process, started on first use and again if it dies. */
class Spawner {
  private helper: ChildProcess | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();

  get pid(): number | undefined {
    return this.helper?.pid;
  }

  start(request: SpawnRequest): Promise<StartedProcess> {
    const helper = this.ensureHelper();
    const id = this.nextId++;
    return new Promise<StartedProcess>((resolveStart, rejectStart) => {
      let resolveExit: (exit: ProcessExit) => void = () => undefined;
      let rejectExit: (err: Error) => void = () => undefined;
      const exited = new Promise<ProcessExit>((res, rej) => {
        resolveExit = res;
        rejectExit = rej;
      });
      exited.catch(() => undefined); // a caller that never waits (background) must not see it as unhandled
      this.pending.set(id, {
        helper,
        spawned: (pid, startTime) => {
          if (request.background) this.pending.delete(id);
          resolveStart({ pid, startTime, exited });
        },
        failed: (err) => {
          this.pending.delete(id);
          rejectStart(err);
        },
        exited: (exit) => {
          this.pending.delete(id);
          resolveExit(exit);
        },
        // Whichever is still open fails: a settled promise ignores the other call.
        lost: (err) => {
          rejectStart(err);
          rejectExit(err);
        },
      });
      const message: ToHelper = { ...request, id };
      helper.send(message, (err) => {
        if (err) this.lose(helper, new StasisError('INTERNAL', `could not reach the process starter: ${err.message}`));
      });
    });
  }

  private ensureHelper(): ChildProcess {
    if (this.helper && this.helper.exitCode === null && this.helper.connected) return this.helper;
    const main = require.resolve('./spawner-main');
    // Run from the TypeScript sources (as the tests do), the helper compiles its files as jest does.
    const execArgv = main.endsWith('.ts') ? ['-r', path.resolve(__dirname, '..', 'scripts', 'register-ts.js')] : [];
    const helper = fork(main, [], {
      execArgv,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      serialization: 'advanced',
    });
    helper.on('message', (message: FromHelper) => this.receive(message));
    helper.on('exit', (code, signal) => {
      if (this.helper === helper) this.helper = undefined;
      this.lose(helper, new StasisError('INTERNAL', `the process starter exited (${signal ?? `code ${code}`})`));
    });
    helper.on('error', () => undefined); // 'exit' follows and fails what was pending
    // Neither the helper nor its channel keeps the worker alive; it exits when the worker goes.
    helper.unref();
    helper.channel?.unref();
    this.helper = helper;
    return helper;
  }

  private receive(message: FromHelper): void {
    const pending = this.pending.get(message.id);
    if (!pending) return;
    if (message.kind === 'spawned') pending.spawned(message.pid, message.startTime);
    else if (message.kind === 'failed') pending.failed(new StasisError(message.code, message.message));
    else pending.exited(message.exit);
  }

  /** A helper is gone: its starts not confirmed fail, and its foreground processes' outcomes are unknown. */
  private lose(helper: ChildProcess, err: Error): void {
    for (const [id, pending] of this.pending) {
      if (pending.helper !== helper) continue;
      this.pending.delete(id);
      pending.lost(err);
    }
  }
}

const spawner = new Spawner();

/** Starts a process through the helper and resolves once it runs (or rejects with why it could not start). */
export function startProcess(request: SpawnRequest): Promise<StartedProcess> {
  return spawner.start(request);
}

/** The helper's pid: its children are this worker's, for the process scan. */
export function spawnerPid(): number | undefined {
  return spawner.pid;
}

/** How long output pipes may stay open after the command exits (a background child can hold them). */
const PIPE_GRACE_MS = 200;

/** The helper's side (run by spawner-main): starts what it is sent, reports the pid and, for foreground processes, the exit. */
export function serveSpawner(): void {
  // The worker gone (the channel closed), a reply has nowhere to go; 'disconnect' ends the helper.
  const reply = (message: FromHelper) => process.send?.(message, undefined, {}, () => undefined);
  process.on('disconnect', () => process.exit(0));
  // The helper serves every sandbox on the host, so no single request may take it down: whatever
  // arrives is checked first, and anything spawn() still throws fails that request alone.
  process.on('message', (message: unknown) => {
    const id = (message as { id?: unknown } | null)?.id;
    if (typeof id !== 'number') return; // nobody to answer
    const failed = (code: 'INVALID_ARGUMENT' | 'INTERNAL', text: string) =>
      reply({ id, kind: 'failed', code, message: text });
    const problem = requestProblem(message as Record<string, unknown>);
    if (problem) return failed('INVALID_ARGUMENT', `process start request: ${problem}`);
    try {
      start(message as ToHelper, reply);
    } catch (err) {
      failed(
        'INTERNAL',
        `could not start ${(message as ToHelper).file}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
  });
}

function start(request: ToHelper, reply: (message: FromHelper) => void): void {
  const child = spawn(request.file, request.args, {
    cwd: request.cwd,
    env: request.env,
    // Its own process group: a timeout or a release kills the command with everything it started.
    detached: true,
    stdio: [
      request.stdin === undefined ? 'ignore' : 'pipe',
      request.background ? 'ignore' : 'pipe',
      request.background ? 'ignore' : 'pipe',
      ...(request.fd3 === undefined ? [] : ['pipe' as const]),
    ],
  });
  // Read now, before this helper's event loop can reap the child (a zombie's stat is still there): its
  // pid cannot have been handed to another process yet.
  const startTime = child.pid === undefined ? undefined : processStat(child.pid)?.startTime;
  child.once('error', (err) =>
    reply({
      id: request.id,
      kind: 'failed',
      code: 'INTERNAL',
      message: `could not start ${request.file}: ${err.message}`,
    }),
  );
  // A process that exits without reading its input closes the pipe (EPIPE): its exit says what happened.
  child.stdin?.on('error', () => undefined);
  child.stdin?.end(request.stdin);
  const fd3 = request.fd3 === undefined ? undefined : (child.stdio[3] as Writable | null | undefined);
  fd3?.on('error', () => undefined); // likewise, if it exits before reading
  fd3?.end(request.fd3);
  child.once('spawn', () => {
    if (child.pid === undefined) return; // not started: 'error' reports it
    reply({ id: request.id, kind: 'spawned', pid: child.pid, startTime });
    if (request.background) child.unref();
    else collect(child, request.maxOutputBytes, (exit) => reply({ id: request.id, kind: 'exited', exit }));
  });
}

/** One argv or environment string may be at most this long (the kernel's MAX_ARG_STRLEN, with its NUL). */
const MAX_ARG_BYTES = 128 * 1024 - 1;

/** What is wrong with a request as it arrived over the channel, naming the field; undefined when it can be started. */
function requestProblem(request: Record<string, unknown>): string | undefined {
  const text = (value: unknown, field: string): string | undefined => {
    if (typeof value !== 'string') return `${field} must be a string`;
    if (value.includes('\0')) return `${field} contains a NUL byte`;
    if (Buffer.byteLength(value) > MAX_ARG_BYTES) return `${field} is too long (over 128 KiB)`;
    return undefined;
  };
  const { file, args, cwd, env, background, maxOutputBytes, stdin, fd3 } = request;
  const problems = [text(file, 'file'), text(cwd, 'cwd')];
  if (!Array.isArray(args)) problems.push('args must be an array');
  else args.forEach((arg, i) => problems.push(text(arg, `args[${i}]`)));
  if (typeof env !== 'object' || env === null || Array.isArray(env)) problems.push('env must be an object');
  else {
    for (const [name, value] of Object.entries(env)) {
      if (name === '' || name.includes('=') || name.includes('\0'))
        problems.push(`env has an invalid name ${JSON.stringify(name)} (empty, or with "=" or a NUL byte)`);
      else problems.push(text(value, `env.${name}`));
    }
  }
  if (typeof background !== 'boolean') problems.push('background must be a boolean');
  if (typeof maxOutputBytes !== 'number' || !Number.isSafeInteger(maxOutputBytes) || maxOutputBytes < 0)
    problems.push('maxOutputBytes must be a non-negative integer');
  if (stdin !== undefined && typeof stdin !== 'string') problems.push('stdin must be a string');
  if (fd3 !== undefined && !(fd3 instanceof Uint8Array)) problems.push('fd3 must be bytes');
  return problems.find((p) => p !== undefined);
}

function collect(child: ChildProcess, maxOutputBytes: number, done: (exit: ProcessExit) => void): void {
  const stdout = new CappedBuffer(maxOutputBytes);
  const stderr = new CappedBuffer(maxOutputBytes);
  child.stdout?.on('error', () => undefined); // destroyed after the exit grace; 'exit' reports the outcome
  child.stderr?.on('error', () => undefined);
  child.stdout?.on('data', (chunk: Buffer) => stdout.push(chunk));
  child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
  child.once('exit', (code, signal) => {
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(grace);
      child.stdout?.destroy();
      child.stderr?.destroy();
      done({ code, signal, stdout: stdout.text(), stderr: stderr.text() });
    };
    const grace = setTimeout(finish, PIPE_GRACE_MS);
    child.once('close', finish);
  });
}

/** Keeps the first `limit` bytes of a stream and says when the rest was dropped. */
class CappedBuffer {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  private dropped = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    const room = this.limit - this.size;
    if (room > 0) {
      const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
      this.chunks.push(kept);
      this.size += kept.length;
    }
    this.dropped += Math.max(0, chunk.length - Math.max(0, room));
  }

  text(): string {
    const text = Buffer.concat(this.chunks).toString('utf8');
    return this.dropped > 0
      ? `${text}\n[stasis: output truncated after ${this.limit} bytes, ${this.dropped} more dropped]`
      : text;
  }
}
