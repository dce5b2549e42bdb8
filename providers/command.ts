import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { constants } from 'node:os';
import { StasisError } from '../common/errors';
import { abortReason } from '../stores/abort';
import type { ExecOutcome } from './api';
import { sendSignal } from './processes';
import type { SandboxPaths } from './sandbox-state';

// Starting processes in a sandbox. What differs between providers is only how a
// command is wrapped (plain, or inside bubblewrap); everything else is shared.

export interface WrappedCommand {
  file: string;
  args: string[];
  /** HOME as the sandboxed process sees it. */
  home: string;
}

export interface CommandWrapper {
  /** Fails (NOT_SUPPORTED) when the host cannot run this wrapper, e.g. bubblewrap is not installed. */
  check(): Promise<void>;
  /** How `argv` runs in the sandbox laid out at `paths`, with its workspace as the working directory. */
  wrap(paths: SandboxPaths, argv: string[]): WrappedCommand;
}

/** Runs commands directly on the host, in the sandbox's directories. */
export const hostCommands: CommandWrapper = {
  async check() {},
  wrap(paths, argv) {
    return { file: argv[0], args: argv.slice(1), home: paths.home };
  },
};

/** A base environment: the worker's own (with its credentials) never reaches a sandbox. */
const BASE_ENV = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  LANG: 'C.UTF-8',
};

export interface SpawnOptions {
  /** Sandbox env, request env and markers, in increasing precedence. */
  env: Record<string, string>;
  /** Long-lived processes are not waited for and do not keep the worker alive. */
  background?: boolean;
}

/**
 * Starts `argv` in the sandbox as the leader of its own process group (so a
 * timeout kills the command with everything it started) and waits until it runs.
 */
export async function spawnInSandbox(
  wrapper: CommandWrapper,
  paths: SandboxPaths,
  argv: string[],
  options: SpawnOptions,
): Promise<ChildProcess> {
  const command = wrapper.wrap(paths, argv);
  const child = spawn(command.file, command.args, {
    cwd: paths.workspace,
    env: { ...BASE_ENV, HOME: command.home, ...options.env },
    detached: true,
    stdio: options.background ? 'ignore' : ['ignore', 'pipe', 'pipe'],
  });
  try {
    await once(child, 'spawn');
  } catch (err) {
    throw new StasisError(
      'INTERNAL',
      `could not start ${command.file}: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
  if (options.background) child.unref();
  return child;
}

export interface WaitOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
  maxOutputBytes: number;
}

/** How long output pipes may stay open after the command exits (a background child can hold them). */
const PIPE_GRACE_MS = 200;
/** Exit code reported for a timeout, as timeout(1) does. */
const TIMEOUT_EXIT_CODE = 124;

/**
 * Collects a command's output (each stream capped) and exit code. A timeout or
 * an abort kills its whole process group; an abort rejects with the signal's reason.
 */
export function waitForOutcome(child: ChildProcess, options: WaitOptions): Promise<ExecOutcome> {
  const stdout = new CappedBuffer(options.maxOutputBytes);
  const stderr = new CappedBuffer(options.maxOutputBytes);
  child.stdout?.on('data', (chunk: Buffer) => stdout.push(chunk));
  child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
  const killGroup = () => {
    if (child.pid !== undefined) sendSignal(-child.pid, 'SIGKILL');
  };
  let timedOut = false;
  const timer =
    options.timeoutMs === undefined
      ? undefined
      : setTimeout(() => {
          timedOut = true;
          killGroup();
        }, options.timeoutMs);
  options.signal?.addEventListener('abort', killGroup, { once: true });

  return new Promise((resolve, reject) => {
    child.once('exit', (code, signal) => {
      let finished = false;
      const finish = () => {
        if (finished) return;
        finished = true;
        clearTimeout(grace);
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', killGroup);
        child.stdout?.destroy();
        child.stderr?.destroy();
        if (options.signal?.aborted) {
          reject(abortReason(options.signal, 'exec'));
          return;
        }
        const note = timedOut ? `[stasis: command timed out after ${options.timeoutMs} ms and was killed]` : '';
        resolve({
          exitCode: timedOut ? TIMEOUT_EXIT_CODE : (code ?? 128 + (signal ? constants.signals[signal] : 0)),
          stdout: stdout.text(),
          stderr: [stderr.text(), note].filter(Boolean).join('\n'),
        });
      };
      const grace = setTimeout(finish, PIPE_GRACE_MS);
      child.once('close', finish);
    });
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
