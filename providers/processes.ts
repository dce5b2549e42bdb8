import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { StasisError } from '../common/errors';

// Every process of a sandbox carries two environment variables, inherited by
// everything it starts. Scanning /proc/*/environ for them finds all of a
// sandbox's processes, grandchildren and daemons that left the process group
// included, so they can be counted, frozen, thawed and killed together.

export interface SandboxMarker {
  sandboxId: string;
  /** Two workers on one machine (tests, `stasis dev` beside a real worker) never touch each other's sandboxes. */
  hostId: string;
}

const ID_VAR = 'STASIS_SANDBOX_ID';
const HOST_VAR = 'STASIS_SANDBOX_HOST';

export function markerEnv(marker: SandboxMarker): Record<string, string> {
  return { [ID_VAR]: marker.sandboxId, [HOST_VAR]: marker.hostId };
}

interface ProcessInfo {
  pid: number;
  /** The state letter of /proc/<pid>/stat: R, S, D, T (stopped), Z (zombie)... */
  state: string;
}

/**
 * Live (non-zombie) processes of every sandbox of `hostId`, by sandbox id.
 * /proc files are read synchronously: they are generated in memory and never
 * block, and a few hundred of them through the libuv thread pool take 20x longer.
 */
export async function scanSandboxProcesses(hostId: string): Promise<Map<string, ProcessInfo[]>> {
  const bySandbox = new Map<string, ProcessInfo[]>();
  const add = (pid: number, state: string, environ: string | undefined) => {
    const sandboxId = markedSandbox(environ, hostId);
    if (sandboxId === undefined) return;
    const list = bySandbox.get(sandboxId) ?? [];
    list.push({ pid, state });
    bySandbox.set(sandboxId, list);
  };
  let unreadable: { pid: number; state: string }[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(name) || Number(name) === process.pid) continue;
    const pid = Number(name);
    const stat = processStat(pid);
    if (!stat || stat.kernelThread || stat.state === 'Z' || stat.state === 'X') continue;
    const environ = readEnviron(pid);
    if (environ === '') unreadable.push({ pid, state: stat.state });
    else add(pid, stat.state, environ);
  }
  // During execve the new image's environment is briefly unreadable (empty): a process
  // missed then would escape a kill, so look again until it shows one.
  for (let retry = 0; unreadable.length > 0 && retry < EXEC_WINDOW_RETRIES; retry += 1) {
    await sleep(1);
    const still: typeof unreadable = [];
    for (const entry of unreadable) {
      const environ = readEnviron(entry.pid);
      if (environ === '') still.push(entry);
      else add(entry.pid, entry.state, environ);
    }
    unreadable = still;
  }
  return bySandbox;
}

export async function sandboxProcesses(marker: SandboxMarker): Promise<ProcessInfo[]> {
  return (await scanSandboxProcesses(marker.hostId)).get(marker.sandboxId) ?? [];
}

/** Sends `signal` to every process of the sandbox. */
export async function signalSandbox(marker: SandboxMarker, signal: NodeJS.Signals): Promise<void> {
  for (const { pid } of await sandboxProcesses(marker)) sendSignal(pid, signal);
}

/**
 * SIGSTOPs the sandbox until every process is seen stopped in a scan that finds
 * no new one, so a process forked during the freeze is caught too.
 */
export async function freezeSandbox(marker: SandboxMarker, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const running = (await sandboxProcesses(marker)).filter((p) => p.state !== 'T' && p.state !== 't');
    if (running.length === 0) return;
    if (Date.now() > deadline) {
      throw new StasisError(
        'UNAVAILABLE',
        `sandbox ${marker.sandboxId}: processes ${running.map((p) => p.pid).join(', ')} did not stop`,
      );
    }
    for (const { pid } of running) sendSignal(pid, 'SIGSTOP');
    await sleep(5);
  }
}

/** SIGKILLs every process of the sandbox until none is left. */
export async function killSandbox(marker: SandboxMarker, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const alive = await sandboxProcesses(marker);
    if (alive.length === 0) return;
    if (Date.now() > deadline) {
      throw new StasisError(
        'UNAVAILABLE',
        `sandbox ${marker.sandboxId}: processes ${alive.map((p) => p.pid).join(', ')} survived SIGKILL`,
      );
    }
    for (const { pid } of alive) sendSignal(pid, 'SIGKILL');
    await sleep(10);
  }
}

/** Signals a process or, with a negative id, a process group; one that is already gone is no error. */
export function sendSignal(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // ESRCH: it exited meanwhile
  }
}

/** Rescans of an empty environ while a process may be in execve. */
const EXEC_WINDOW_RETRIES = 20;

function markedSandbox(environ: string | undefined, hostId: string): string | undefined {
  let sandboxId: string | undefined;
  let host: string | undefined;
  for (const entry of (environ ?? '').split('\0')) {
    if (entry.startsWith(`${ID_VAR}=`)) sandboxId = entry.slice(ID_VAR.length + 1);
    else if (entry.startsWith(`${HOST_VAR}=`)) host = entry.slice(HOST_VAR.length + 1);
  }
  return host === hostId ? sandboxId : undefined;
}

/** The environ of `pid`, or undefined when it is gone or not ours to read. */
function readEnviron(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'latin1');
  } catch {
    return undefined;
  }
}

/** PF_KTHREAD in the flags of /proc/<pid>/stat: kernel threads have no environment to read. */
const PF_KTHREAD = 0x00200000;

function processStat(pid: number): { state: string; kernelThread: boolean } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    // The command name may contain spaces and parentheses; the fields after it start at the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { state: fields[0], kernelThread: (Number(fields[6]) & PF_KTHREAD) !== 0 };
  } catch {
    return undefined;
  }
}
