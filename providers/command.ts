import { constants } from 'node:os';
import { abortReason } from '../stores/abort';
import type { ExecOutcome } from './api';
import { confine, joined, type ResolvedLimits } from './limits';
import { sendSignal, trackStarted, type SandboxMarker } from './processes';
import type { SandboxPaths } from './sandbox-state';
import { startProcess, type StartedProcess } from './spawner';

// Starting processes in a sandbox. What differs between providers is only how a
// command is wrapped (plain, or inside bubblewrap); everything else is shared.

/** What the host starts so that a command runs in a sandbox. */
export interface WrappedCommand {
  /** An absolute path: never looked up in a PATH the sandbox chose. */
  file: string;
  args: string[];
  cwd: string;
  /** The environment of the process the host starts. */
  env: Record<string, string>;
  /** Bytes the host's process reads on descriptor 3 (see SpawnRequest.fd3): bubblewrap's seccomp program. */
  fd3?: Uint8Array;
}

export interface CommandWrapper {
  /** Fails (NOT_SUPPORTED) when the host cannot run this wrapper, e.g. bubblewrap is not installed. */
  check(): Promise<void>;
  /** How `argv` runs with environment `env` in the sandbox laid out at `paths`, in its workspace. */
  wrap(paths: SandboxPaths, argv: string[], env: Record<string, string>): WrappedCommand;
}

/** Runs commands directly on the host, in the sandbox's directories. */
export const hostCommands: CommandWrapper = {
  async check() {},
  wrap(paths, argv, env) {
    return { file: argv[0], args: argv.slice(1), cwd: paths.workspace, env: sandboxEnv(paths.home, env) };
  },
};

/** A base environment: the worker's own (with its credentials) never reaches a sandbox. */
const BASE_ENV = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  LANG: 'C.UTF-8',
};

/** The environment a sandboxed command sees: the base, HOME, then the sandbox's own (which may override both). */
export function sandboxEnv(home: string, env: Record<string, string>): Record<string, string> {
  return { ...BASE_ENV, HOME: home, ...env };
}

/** The PATH of processes the host starts for itself (launchers), fixed whatever a sandbox sets. */
export const SYSTEM_PATH = BASE_ENV.PATH;

export interface SpawnOptions {
  /** Whose process it is: it joins that sandbox's control groups and takes its limits. */
  sandbox: { marker: SandboxMarker; limits: ResolvedLimits };
  /** Sandbox env, request env and markers, in increasing precedence. */
  env: Record<string, string>;
  /** Long-lived processes are not waited for and do not keep the worker alive. */
  background?: boolean;
  /** Cap on each of stdout and stderr kept for a foreground command. */
  maxOutputBytes?: number;
  /** Written to the command's stdin (see SpawnRequest.stdin). */
  stdin?: string;
}

/**
 * A shell command as argv: the script arrives on stdin (no argv limit on its length) and
 * runs with stdin at /dev/null, as a command given with `bash -c` would. Node's stdin pipe is a
 * socket, which /dev/stdin cannot open, and on which bash would read ~/.bashrc as if started by
 * sshd, hence --norc. bash's own `read -N` takes it to the end, buffered and byte for byte (`$(cat)`
 * cost a fork and an exec per command, ~10 ms of CPU), into a variable unset before the script runs.
 * The sandbox's environment reaches this shell: TMOUT would cut the read short and run part of the
 * script (hence `TMOUT=` for the read alone), and SHELLOPTS=errexit would end the shell on the read's
 * status at end of input (hence `|| :`); REPLY, unlike the variable used, is the script's to see.
 */
export const SHELL_FROM_STDIN = [
  '/bin/bash',
  '--norc',
  '-c',
  'TMOUT= read -r -N 2147483647 STASIS_SCRIPT || :; eval "unset -v STASIS_SCRIPT; $STASIS_SCRIPT" </dev/null',
];

/**
 * Starts `argv` in the sandbox as the leader of its own process group (so a
 * timeout kills the command with everything it started) and waits until it runs.
 */
export async function spawnInSandbox(
  wrapper: CommandWrapper,
  paths: SandboxPaths,
  argv: string[],
  options: SpawnOptions,
): Promise<StartedProcess> {
  const command = wrapper.wrap(paths, argv, options.env);
  const { join, ...confined } = confine(options.sandbox.marker, options.sandbox.limits, command);
  const started = await startProcess({
    ...command,
    ...confined,
    background: options.background ?? false,
    maxOutputBytes: options.maxOutputBytes ?? 0,
    ...(options.stdin === undefined ? {} : { stdin: options.stdin }),
  });
  trackStarted(options.sandbox.marker, started.pid, started.startTime);
  await joined(started.pid, join);
  return started;
}

export interface WaitOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Exit code reported for a timeout, as timeout(1) does. */
const TIMEOUT_EXIT_CODE = 124;

/**
 * A command's output and exit code. A timeout or an abort kills its whole
 * process group; an abort rejects with the signal's reason.
 */
export async function waitForOutcome(child: StartedProcess, options: WaitOptions): Promise<ExecOutcome> {
  const killGroup = () => sendSignal(-child.pid, 'SIGKILL');
  let timedOut = false;
  const timer =
    options.timeoutMs === undefined
      ? undefined
      : setTimeout(() => {
          timedOut = true;
          killGroup();
        }, options.timeoutMs);
  options.signal?.addEventListener('abort', killGroup, { once: true });
  // Aborted while the command was starting: no 'abort' event comes any more.
  if (options.signal?.aborted) killGroup();
  try {
    const { code, signal, stdout, stderr } = await child.exited;
    if (options.signal?.aborted) throw abortReason(options.signal, 'exec');
    const note = timedOut ? `[stasis: command timed out after ${options.timeoutMs} ms and was killed]` : '';
    return {
      exitCode: timedOut ? TIMEOUT_EXIT_CODE : (code ?? 128 + (signal ? constants.signals[signal] : 0)),
      stdout,
      stderr: [stderr, note].filter(Boolean).join('\n'),
    };
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener('abort', killGroup);
  }
}
