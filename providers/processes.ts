import * as fs from 'node:fs/promises';
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

/** Live (non-zombie) processes of every sandbox of `hostId`, by sandbox id. */
export async function scanSandboxProcesses(hostId: string): Promise<Map<string, ProcessInfo[]>> {
  const bySandbox = new Map<string, ProcessInfo[]>();
  const pids = (await fs.readdir('/proc')).filter((name) => /^[0-9]+$/.test(name)).map(Number);
  await Promise.all(
    pids
      .filter((pid) => pid !== process.pid)
      .map(async (pid) => {
        const sandboxId = await markedSandbox(pid, hostId);
        if (sandboxId === undefined) return;
        const state = await processState(pid);
        if (state === undefined || state === 'Z' || state === 'X') return;
        const list = bySandbox.get(sandboxId) ?? [];
        list.push({ pid, state });
        bySandbox.set(sandboxId, list);
      }),
  );
  return bySandbox;
}

export async function sandboxProcesses(marker: SandboxMarker): Promise<ProcessInfo[]> {
  return (await scanSandboxProcesses(marker.hostId)).get(marker.sandboxId) ?? [];
}

/** Sends `signal` to every process of the sandbox; returns how many got it. */
export async function signalSandbox(marker: SandboxMarker, signal: NodeJS.Signals): Promise<number> {
  let sent = 0;
  for (const { pid } of await sandboxProcesses(marker)) if (sendSignal(pid, signal)) sent += 1;
  return sent;
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

/** Signals a process or, with a negative id, a process group; false when it is already gone. */
export function sendSignal(pid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(pid, signal);
    return true;
  } catch {
    return false;
  }
}

async function markedSandbox(pid: number, hostId: string): Promise<string | undefined> {
  let environ: string;
  try {
    environ = await fs.readFile(`/proc/${pid}/environ`, 'latin1');
  } catch {
    return undefined; // gone, or not ours to read
  }
  let sandboxId: string | undefined;
  let host: string | undefined;
  for (const entry of environ.split('\0')) {
    if (entry.startsWith(`${ID_VAR}=`)) sandboxId = entry.slice(ID_VAR.length + 1);
    else if (entry.startsWith(`${HOST_VAR}=`)) host = entry.slice(HOST_VAR.length + 1);
  }
  return host === hostId ? sandboxId : undefined;
}

async function processState(pid: number): Promise<string | undefined> {
  try {
    const stat = await fs.readFile(`/proc/${pid}/stat`, 'latin1');
    // The command name may contain spaces and parentheses; the state follows the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  } catch {
    return undefined;
  }
}
