import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

// Server processes (Temporal, MinIO) run in their own process group so that one
// signal reaches everything they fork, and so a terminal's Ctrl-C does not hit
// them before we shut them down in order. Groups we own are killed when this
// process exits, however it exits, so no server outlives its parent.

export interface GroupProcess {
  /** Process id; also the process group id. */
  readonly pid: number;
  readonly logFile: string;
  /** Resolves when the process exits (never rejects). */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  hasExited(): boolean;
}

export interface SpawnGroupOptions {
  env?: NodeJS.ProcessEnv;
  /** stdout and stderr are appended here, not to the console. */
  logFile: string;
  /**
   * Owned processes are killed when this process exits. A process started on behalf
   * of someone else (e.g. a test restarting the shared MinIO) is not owned: it is
   * left running and its owner stops it by pid.
   */
  owned?: boolean;
}

const ownedGroups = new Set<number>();
let hooksInstalled = false;

export function spawnGroup(command: string, args: readonly string[], options: SpawnGroupOptions): GroupProcess {
  fs.mkdirSync(path.dirname(options.logFile), { recursive: true });
  const log = fs.openSync(options.logFile, 'a');
  fs.writeSync(log, `\n--- ${new Date().toISOString()} ${command} ${args.join(' ')}\n`);
  const owned = options.owned ?? true;
  let child;
  try {
    child = spawn(command, args, { env: options.env ?? process.env, stdio: ['ignore', log, log], detached: true });
  } finally {
    fs.closeSync(log);
  }
  let done = false;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => {
      done = true;
      resolve({ code, signal });
    });
    child.once('error', (error) => {
      done = true;
      fs.appendFileSync(options.logFile, `spawn failed: ${error.message}\n`);
      resolve({ code: null, signal: null });
    });
  });
  const pid = child.pid;
  if (pid === undefined) {
    throw new Error(`could not start ${command}; see ${options.logFile}`);
  }
  if (owned) {
    ownedGroups.add(pid);
    installExitHooks();
    void exited.then(() => ownedGroups.delete(pid));
  } else {
    child.unref();
  }
  return { pid, logFile: options.logFile, exited, hasExited: () => done };
}

/** True while the process exists and is not a zombie waiting to be reaped. */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return true; // no /proc (macOS): kill(0) is all we know
  }
}

function groupExists(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return isAlive(pgid) || groupHasLiveMember(pgid);
  } catch {
    return false;
  }
}

function groupHasLiveMember(pgid: number): boolean {
  let entries: string[];
  try {
    entries = fs.readdirSync('/proc').filter((name) => /^[0-9]+$/.test(name));
  } catch {
    return true;
  }
  return entries.some((name) => {
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      return Number(fields[2]) === pgid && fields[0] !== 'Z';
    } catch {
      return false;
    }
  });
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: already gone.
  }
}

async function waitUntil(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (condition()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return condition();
}

/** SIGTERM the group, SIGKILL it after `graceMs`, and wait until it is gone. */
export async function stopGroup(pgid: number, graceMs = 10_000): Promise<void> {
  signalGroup(pgid, 'SIGTERM');
  if (await waitUntil(() => !groupExists(pgid), graceMs)) return;
  signalGroup(pgid, 'SIGKILL');
  if (!(await waitUntil(() => !groupExists(pgid), 5_000))) {
    throw new Error(`process group ${pgid} did not exit after SIGKILL`);
  }
}

function killOwnedNow(): void {
  for (const pgid of ownedGroups) signalGroup(pgid, 'SIGKILL');
  ownedGroups.clear();
}

// 'exit' covers normal ends and process.exit(). A fatal signal skips 'exit', so
// when nobody else handles the signal we clean up and re-raise it (the
// approach of the signal-exit package); when the application has its own
// handler, it owns the shutdown and 'exit' still covers us.
function installExitHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on('exit', killOwnedNow);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const onSignal = (): void => {
      if (process.listenerCount(signal) > 1) return;
      killOwnedNow();
      process.removeListener(signal, onSignal);
      process.kill(process.pid, signal);
    };
    process.on(signal, onSignal);
  }
}
