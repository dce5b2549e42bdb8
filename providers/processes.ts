import { closeSync, openSync, readdirSync, readlinkSync, readSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { StasisError } from '../common/errors';
import { cgroupTracking, freezeGroup, groupPids, hostGroupPids, killGroup, thawGroup } from './cgroups';
import { spawnerPid } from './spawner';

// A sandbox's processes, found to be counted, frozen, thawed and killed together,
// grandchildren and daemons that left the process group included.
//
// Where the host lets the worker create cgroup v2 groups (cgroups.ts), a sandbox's
// processes are the members of its group: a process cannot leave it, and nothing it
// sets in its environment matters. Elsewhere every process of a sandbox carries two
// environment variables, inherited by everything it starts, and /proc/*/environ is
// scanned for them; a sandbox process can unset or forge them there. A bwrap sandbox
// is found by its pid namespace instead, which none of its processes can leave; a
// `local` one, which has no namespace, only holds against processes that do not try
// (README, "Sandbox processes and limits").

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

/** Only the marker of a sandbox environment: what a launcher the host starts for the sandbox carries. */
export function markerOnly(env: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter(([name]) => name === ID_VAR || name === HOST_VAR));
}

interface ProcessInfo {
  pid: number;
  /** The state letter of /proc/<pid>/stat: R, S, D, T (stopped), Z (zombie)... */
  state: string;
}

/** A process's marker as last read, valid while the same process (pid and start time) lives. */
interface KnownMarker {
  startTime: string;
  marker: SandboxMarker | undefined;
}

/**
 * Markers by pid. A marked process stays marked for its life (its sandbox's, even if it
 * later execs with another environment); an unmarked one is only remembered when it cannot
 * gain a marker: a child of this worker or of its process starter may be between fork and
 * exec, still carrying its parent's environment, so those are read again each scan.
 */
const known = new Map<number, KnownMarker>();

/**
 * Live (non-zombie) processes of every sandbox of `hostId`, by sandbox id.
 * /proc files are read synchronously, into one reused buffer: they are generated in
 * memory and never block, a few hundred of them through the libuv thread pool take
 * 20x longer, and a fresh buffer per read made allocation the cost of a scan.
 */
async function scanByEnvironment(hostId: string): Promise<Map<string, ProcessInfo[]>> {
  const found: { pid: number; ppid: number; state: string; marker: SandboxMarker | undefined }[] = [];
  type Stat = NonNullable<ReturnType<typeof processStat>>;
  const add = (pid: number, stat: Stat, marker: SandboxMarker | undefined) =>
    found.push({ pid, ppid: stat.ppid, state: stat.state, marker });
  const seen = new Set<number>();
  const learn = (pid: number, stat: Stat, environ: string | undefined) => {
    const marker = markerIn(environ);
    if (marker || (stat.ppid !== process.pid && stat.ppid !== spawnerPid()))
      known.set(pid, { startTime: stat.startTime, marker });
    add(pid, stat, marker);
  };
  let unreadable: { pid: number; stat: Stat }[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(name) || Number(name) === process.pid) continue;
    const pid = Number(name);
    const stat = processStat(pid);
    if (!stat || stat.kernelThread || stat.state === 'Z' || stat.state === 'X') continue;
    seen.add(pid);
    const cached = known.get(pid);
    if (cached?.startTime === stat.startTime) {
      add(pid, stat, cached.marker);
      continue;
    }
    const environ = readEnviron(pid);
    if (environ === '') unreadable.push({ pid, stat });
    else learn(pid, stat, environ);
  }
  for (const pid of known.keys()) if (!seen.has(pid)) known.delete(pid);
  // During execve the new image's environment is briefly unreadable (empty): a process
  // missed then would escape a kill, so look again until it shows one.
  for (let retry = 0; unreadable.length > 0 && retry < EXEC_WINDOW_RETRIES; retry += 1) {
    await sleep(1);
    const still: typeof unreadable = [];
    for (const entry of unreadable) {
      const environ = readEnviron(entry.pid);
      if (environ === '') still.push(entry);
      else learn(entry.pid, entry.stat, environ);
    }
    unreadable = still;
  }
  // Still empty: an environment cleared on purpose (`env -i`), which carries no marker but may be in a sandbox's namespace.
  for (const { pid, stat } of unreadable) add(pid, stat, undefined);
  return byNamespace(hostId, found);
}

/**
 * Groups the scanned processes by sandbox. A sandbox started in its own pid
 * namespace (bwrap) is known by it, not by what its processes set: the
 * namespace's first process is the launcher's child, started by the host with
 * the marker, and no process inside can leave the namespace (it holds no
 * capability) nor make another sandbox's namespace its own by forging a marker.
 */
function byNamespace(
  hostId: string,
  found: { pid: number; ppid: number; state: string; marker: SandboxMarker | undefined }[],
): Map<string, ProcessInfo[]> {
  const own = pidNamespace(process.pid);
  const owners = new Map<string, string>();
  for (const { pid, ppid, marker } of found) {
    if (marker?.hostId !== hostId) continue;
    const ns = pidNamespace(pid);
    if (ns !== undefined && ns !== own && pidNamespace(ppid) === own) owners.set(ns, marker.sandboxId);
  }
  const bySandbox = new Map<string, ProcessInfo[]>();
  for (const { pid, state, marker } of found) {
    const ns = owners.size > 0 ? pidNamespace(pid) : undefined;
    const sandboxId =
      (ns !== undefined ? owners.get(ns) : undefined) ?? (marker?.hostId === hostId ? marker.sandboxId : undefined);
    if (sandboxId === undefined) continue;
    const list = bySandbox.get(sandboxId) ?? [];
    list.push({ pid, state });
    bySandbox.set(sandboxId, list);
  }
  return bySandbox;
}

/** The pid namespace `pid` lives in (`pid:[<inode>]`), or undefined when it is gone or not ours to read. */
function pidNamespace(pid: number): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/pid`);
  } catch {
    return undefined;
  }
}

/** Live processes of every sandbox of `hostId`, by sandbox id. */
export async function scanSandboxProcesses(hostId: string): Promise<Map<string, ProcessInfo[]>> {
  if (!cgroupTracking()) return scanByEnvironment(hostId);
  const bySandbox = new Map<string, ProcessInfo[]>();
  for (const [sandboxId, pids] of hostGroupPids(hostId)) bySandbox.set(sandboxId, withStates(pids));
  return bySandbox;
}

export async function sandboxProcesses(marker: SandboxMarker): Promise<ProcessInfo[]> {
  if (cgroupTracking()) return withStates(groupPids(marker));
  return (await scanByEnvironment(marker.hostId)).get(marker.sandboxId) ?? [];
}

function withStates(pids: number[]): ProcessInfo[] {
  return pids.flatMap((pid) => {
    const stat = processStat(pid);
    return stat ? [{ pid, state: stat.state }] : [];
  });
}

/** Lets a frozen sandbox run again. */
export async function thawSandbox(marker: SandboxMarker): Promise<void> {
  if (cgroupTracking()) thawGroup(marker);
  else for (const { pid } of await sandboxProcesses(marker)) sendSignal(pid, 'SIGCONT');
}

/**
 * Freezes every process of the sandbox: by its group, or by SIGSTOP until every process
 * is seen stopped in a scan that finds no new one, so one forked meanwhile is caught too.
 */
export async function freezeSandbox(marker: SandboxMarker, timeoutMs = 10_000): Promise<void> {
  if (cgroupTracking()) return freezeGroup(marker, timeoutMs);
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

/** Kills every process of the sandbox until none is left, and removes its groups. */
export async function killSandbox(marker: SandboxMarker, timeoutMs = 10_000): Promise<void> {
  if (!cgroupTracking()) await killByEnvironment(marker, timeoutMs);
  await killGroup(marker, timeoutMs);
}

async function killByEnvironment(marker: SandboxMarker, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const alive = (await scanByEnvironment(marker.hostId)).get(marker.sandboxId) ?? [];
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

/** The environment scan alone, whatever the host offers: for the tests of that fallback. */
export const byEnvironment = {
  processes: async (marker: SandboxMarker) => (await scanByEnvironment(marker.hostId)).get(marker.sandboxId) ?? [],
  kill: (marker: SandboxMarker) => killByEnvironment(marker, 10_000),
};

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

function markerIn(environ: string | undefined): SandboxMarker | undefined {
  let sandboxId: string | undefined;
  let hostId: string | undefined;
  for (const entry of (environ ?? '').split('\0')) {
    if (entry.startsWith(`${ID_VAR}=`)) sandboxId = entry.slice(ID_VAR.length + 1);
    else if (entry.startsWith(`${HOST_VAR}=`)) hostId = entry.slice(HOST_VAR.length + 1);
  }
  return sandboxId !== undefined && hostId !== undefined ? { sandboxId, hostId } : undefined;
}

/** The environ of `pid`, or undefined when it is gone or not ours to read. */
function readEnviron(pid: number): string | undefined {
  return readProcFile(`/proc/${pid}/environ`);
}

/** PF_KTHREAD in the flags of /proc/<pid>/stat: kernel threads have no environment to read. */
const PF_KTHREAD = 0x00200000;

function processStat(
  pid: number,
): { state: string; ppid: number; startTime: string; kernelThread: boolean } | undefined {
  const stat = readProcFile(`/proc/${pid}/stat`);
  if (stat === undefined) return undefined;
  // The command name may contain spaces and parentheses; the fields after it start at the last ')'.
  // From there: state (field 3 of proc(5)), ppid (4), flags (9), starttime (22).
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return {
    state: fields[0],
    ppid: Number(fields[1]),
    startTime: fields[19],
    kernelThread: (Number(fields[6]) & PF_KTHREAD) !== 0,
  };
}

let buffer = Buffer.allocUnsafe(64 * 1024);

/** A /proc file's content (their size is unknown until read), or undefined when it cannot be read. */
function readProcFile(file: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(file, 'r');
  } catch {
    return undefined;
  }
  try {
    let length = 0;
    for (;;) {
      if (length === buffer.length) {
        const bigger = Buffer.allocUnsafe(buffer.length * 2);
        buffer.copy(bigger);
        buffer = bigger;
      }
      const n = readSync(fd, buffer, length, buffer.length - length, null);
      if (n === 0) return buffer.toString('latin1', 0, length);
      length += n;
    }
  } catch {
    return undefined; // gone meanwhile, or not ours to read
  } finally {
    closeSync(fd);
  }
}
