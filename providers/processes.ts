import { readdirSync, readlinkSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { StasisError } from '../common/errors';
import { cgroupTracking, freezeGroup, groupPids, hostGroupPids, inPidsGroup, killGroup, thawGroup } from './cgroups';
import { liveThread, processStat, readProcFile } from './proc-files';
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
//
// Without cgroups, a worker does not scan all of /proc for every provider call: it
// keeps an index of each sandbox's processes (see `Tracked`), fed by the process
// starter with every process it starts, and looks only at their descendants and at
// the processes orphans are handed to. All of /proc is scanned once per host per
// worker process (to adopt what an earlier worker started), and by host-wide listings.

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
 * Live (non-zombie) processes of every sandbox of `hostId`, by sandbox id. /proc files are
 * read synchronously (proc-files.ts): a few hundred of them through the libuv thread pool
 * take 20x longer.
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
  if (!cgroupTracking()) {
    const before = pidCursor();
    return seeded(hostId, await scanByEnvironment(hostId), before);
  }
  const bySandbox = new Map<string, ProcessInfo[]>();
  for (const [sandboxId, pids] of hostGroupPids(hostId)) bySandbox.set(sandboxId, withStates(pids));
  return bySandbox;
}

export async function sandboxProcesses(marker: SandboxMarker): Promise<ProcessInfo[]> {
  if (cgroupTracking()) return withStates(groupPids(marker));
  return (await look(marker)).found;
}

/** One look at a sandbox's processes where the host offers no cgroup. */
async function look(marker: SandboxMarker): Promise<Look> {
  // A process that starts none (a test, a CLI) cannot know what a worker started since: it scans.
  if (spawnerPid() === undefined) return environmentLook(marker);
  return indexedLook(marker);
}

async function environmentLook(marker: SandboxMarker): Promise<Look> {
  return {
    found: (await scanByEnvironment(marker.hostId)).get(marker.sandboxId) ?? [],
    groups: [],
    sessions: new Set(),
  };
}

/** Through the index; the first look at a host in this process scans /proc once, to adopt what was started before. */
async function indexedProcesses(marker: SandboxMarker): Promise<ProcessInfo[]> {
  return (await indexedLook(marker)).found;
}

async function indexedLook(marker: SandboxMarker): Promise<Look> {
  if (!seededHosts.has(marker.hostId)) {
    const before = pidCursor();
    seeded(marker.hostId, await scanByEnvironment(marker.hostId), before);
  }
  return walkSandbox(marker);
}

/**
 * A sandbox's processes as one look found them, and the process groups that are wholly its own:
 * signalling a group reaches every member at once, a member forked meanwhile included, where
 * signalling the pids found misses a process that forks and exits faster than the worker looks.
 */
interface Look {
  found: ProcessInfo[];
  groups: number[];
  /** The sessions wholly the sandbox's (see `sessionOwners`), for `signalSessions`. */
  sessions: Set<number>;
}

/** A sandbox's processes as this worker knows them. */
interface Tracked {
  /** pid → start time: the same pid with another start time is another process. */
  pids: Map<number, string>;
  /**
   * The sessions the starter started its processes in (each leads its own). An orphan still in
   * one is the sandbox's even if it dropped its marker: a session id names one session while any
   * process is in it.
   */
  sessions: Set<number>;
}

/** By host and sandbox id; with `owners`, which sandbox each indexed process is (pid → key and start time). */
const index = new Map<string, Tracked>();
const owners = new Map<number, { key: string; startTime: string }>();
/** Hosts whose processes this worker has scanned /proc for once: every sandbox of theirs is in `index` or had none. */
const seededHosts = new Set<string>();

/**
 * Which sandbox each session of `index` is (session id → key), and the pid cursor when a process
 * of it was last seen. A session id is its leader's pid, which the kernel gives to no new process
 * while any process is in that session: until the pid has been handed out again since (`mayBeReused`),
 * the id names the sandbox's session, or one with no process left. So a session is not forgotten
 * when a look happens to find none of it: a process forking as fast as it can is often between
 * two parents while the worker looks.
 */
const sessionOwners = new Map<number, { key: string; confirmed: PidCursor | undefined }>();

/** Whose session `session` is, if its id cannot have been given to another session since it was last confirmed. */
function sessionOwner(session: number, now: PidCursor | undefined): string | undefined {
  const owner = sessionOwners.get(session);
  if (owner && mayBeReused(owner.confirmed, now)(session)) {
    // Its leader, the sandbox's process that made it, still in it: the id names no other session.
    if (leads(owner.key, session)) {
      confirmSession(session, owner.key, now);
      return owner.key;
    }
    forgetSession(session);
    return undefined;
  }
  return owner?.key;
}

/**
 * Whether the process with pid `session` is the one sandbox `key` has indexed (same start time)
 * and still in session `session`: a session's id is its maker's pid, so that process made it.
 */
function leads(key: string, session: number): boolean {
  const owner = owners.get(session);
  const stat = processStat(session);
  return (
    owner?.key === key &&
    stat?.startTime === owner.startTime &&
    stat.session === session &&
    stat.state !== 'Z' &&
    stat.state !== 'X'
  );
}

function confirmSession(session: number, key: string, cursor: PidCursor | undefined): void {
  // Another sandbox's until now: that session ended and its id was handed out again (the starter
  // made a new leader with it). Left in that sandbox's sessions, it would signal this one's.
  const previous = sessionOwners.get(session)?.key;
  if (previous !== undefined && previous !== key) index.get(previous)?.sessions.delete(session);
  trackedOf(key).sessions.add(session);
  sessionOwners.set(session, { key, confirmed: cursor });
}

function forgetSession(session: number): void {
  const owner = sessionOwners.get(session);
  if (!owner) return;
  index.get(owner.key)?.sessions.delete(session);
  sessionOwners.delete(session);
}

const keyOf = (marker: SandboxMarker) => `${marker.hostId}\0${marker.sandboxId}`;

/**
 * Whether `pid`, found in a session of sandbox `key`, proves that session's id was handed out
 * again: the sandbox's processes are held in a group none of them leaves (`inPidsGroup`), and no
 * process joins a session, so one outside the group is in a new session with the old id. Forks
 * that fail at a pids group's limit take a pid without being counted, so a sandbox forking at
 * its limit takes the pid space round unseen by `mayBeReused`; this sees it.
 */
function provesReused(key: string, pid: number, stat: { ppid: number; startTime: string }): boolean {
  const owner = owners.get(pid);
  if (owner?.key === key && owner.startTime === stat.startTime) return false; // the sandbox's by lineage
  const [hostId, sandboxId] = key.split('\0');
  const marker = { hostId, sandboxId };
  // A child shows the root group until its fork completes, while its parent, still forking, is in the group.
  return outsideGroup(marker, pid) && outsideGroup(marker, stat.ppid);
}

/** Whether `pid` is known to be outside the sandbox's pids group: an exiting process shows the root group. */
function outsideGroup(marker: SandboxMarker, pid: number): boolean {
  // A main thread that exited shows the root group too: a live thread of its process is read instead.
  const task = processStat(pid)?.thread ?? pid;
  if (inPidsGroup(marker, task) !== false) return false;
  const stat = processStat(task); // after: its exit began before the group was read, if it did
  return stat !== undefined && !stat.exiting && stat.state !== 'Z' && stat.state !== 'X';
}

function trackedOf(key: string): Tracked {
  let tracked = index.get(key);
  if (!tracked) {
    tracked = { pids: new Map(), sessions: new Set() };
    index.set(key, tracked);
  }
  return tracked;
}

function adopt(key: string, pid: number, stat: { startTime: string; session: number }): void {
  const owner = owners.get(pid);
  if (owner && owner.startTime === stat.startTime) {
    if (owner.key === key) return;
    index.get(owner.key)?.pids.delete(pid);
  }
  owners.set(pid, { key, startTime: stat.startTime });
  trackedOf(key).pids.set(pid, stat.startTime);
}

/** Indexes what a full scan of `hostId` (begun at pid cursor `before`) found, and returns it. */
function seeded(
  hostId: string,
  bySandbox: Map<string, ProcessInfo[]>,
  before: PidCursor | undefined,
): Map<string, ProcessInfo[]> {
  for (const [sandboxId, list] of bySandbox) {
    const key = keyOf({ hostId, sandboxId });
    const pids = new Set(list.map((p) => p.pid));
    for (const pid of pids) {
      const stat = processStat(pid);
      if (!stat) continue;
      // What the index already knows by lineage or session stays: a marker can be forged.
      const owner = owners.get(pid);
      if (owner?.startTime === stat.startTime && owner.key !== key) continue;
      const session = sessionOwners.get(stat.session)?.key;
      if (session !== undefined && session !== key) continue;
      adopt(key, pid, stat);
      // Only a session whose leader is the sandbox's: a marker alone can be forged.
      if (pids.has(stat.session) && !sessionOwners.has(stat.session)) confirmSession(stat.session, key, before);
    }
  }
  seededHosts.add(hostId);
  return bySandbox;
}

/**
 * Tells the index about a process the starter started for a sandbox (`startTime` as the starter read
 * it), with the session it leads. Called as soon as its pid is known; what it forked before that is
 * found below it, or as an orphan.
 */
export function trackStarted(marker: SandboxMarker, pid: number, startTime: string | undefined): void {
  // Kept with cgroups too (one /proc read per start): the tests of the index run on such hosts.
  const stat = processStat(pid);
  // Another process holds the pid now: ours ended and was reaped before the worker heard of it (a
  // stalled worker), and its session with it, as a pid is handed out again only once no process is
  // in the session it names. Nothing of the sandbox is left to index, and the pid is another's.
  if (stat && stat.startTime !== startTime) return;
  const key = keyOf(marker);
  // The starter makes each process the leader of a new session (its id is the pid), even one
  // that has already exited: its orphans are still in that session.
  confirmSession(pid, key, pidCursor());
  if (stat && stat.state !== 'Z' && stat.state !== 'X') adopt(key, pid, stat);
}

/** Children of the reapers as last looked at, and which sandbox each is (undefined: none). */
const reaperChildren = new Map<number, { startTime: string; key: string | undefined }>();
let lastCursor: PidCursor | undefined;

/**
 * Indexes the reapers' children that are a sandbox's: by the session they are in (which a
 * process cannot join), else by their marker. A child looked at before is only read again when
 * its pid may have been given to a new process since (`mayBeReused`): a walk reads /proc for the
 * new processes only, not for every daemon of the host.
 */
function lookAtOrphans(): PidCursor | undefined {
  const cursor = pidCursor();
  const reused = mayBeReused(lastCursor, cursor);
  const current = new Set<number>();
  const worker = process.pid;
  const starter = spawnerPid();
  for (const reaper of reapers()) {
    for (const pid of childrenOf(reaper)) {
      current.add(pid);
      const cached = reaperChildren.get(pid);
      if (cached && cached.key === undefined && !reused(pid)) continue; // the same process, no sandbox's
      const stat = processStat(pid);
      if (!stat || stat.state === 'Z' || stat.state === 'X') {
        reaperChildren.delete(pid);
        continue;
      }
      const owner = owners.get(pid);
      let key = owner?.startTime === stat.startTime ? owner.key : undefined;
      if (key === undefined) {
        // Its session says whose it is before its marker does: a marker can be forged, a session not joined.
        key = sessionOwner(stat.session, cursor);
        if (key !== undefined && provesReused(key, pid, stat)) {
          forgetSession(stat.session);
          key = undefined;
        }
        const marker = key === undefined ? markerOfProcess(pid, stat) : undefined;
        if (marker === UNREAD) continue; // looked at again next time, not remembered as no sandbox's
        if (marker && seededHosts.has(marker.hostId)) key = keyOf(marker);
        if (key !== undefined) adopt(key, pid, stat);
      }
      // A child of the worker or its starter may be between fork and exec: looked at again each time.
      if (stat.ppid !== worker && stat.ppid !== starter) reaperChildren.set(pid, { startTime: stat.startTime, key });
    }
  }
  for (const pid of reaperChildren.keys()) if (!current.has(pid)) reaperChildren.delete(pid);
  lastCursor = cursor;
  return cursor;
}

/** The pid last given out in this pid namespace, and how many processes the host has forked. */
interface PidCursor {
  lastPid: number;
  forks: number;
}

function pidCursor(): PidCursor | undefined {
  const last = lastPid();
  const forks = /^processes (\d+)$/m.exec(readProcFile('/proc/stat') ?? '')?.[1];
  return forks !== undefined && last !== undefined ? { lastPid: last, forks: Number(forks) } : undefined;
}

/** The pid last handed out in this pid namespace (/proc/loadavg). */
function lastPid(): number | undefined {
  const last = Number(readProcFile('/proc/loadavg')?.trim().split(' ')[4]);
  return Number.isSafeInteger(last) ? last : undefined;
}

let pidMax: number | undefined;

/**
 * Which pids may name another process than at `before`: pids are given out in a cycle, so
 * with fewer forks since than the cycle is long, only those between the two cursors. Without
 * both cursors, any.
 */
function mayBeReused(before: PidCursor | undefined, now: PidCursor | undefined): (pid: number) => boolean {
  pidMax ??= Number(readProcFile('/proc/sys/kernel/pid_max')?.trim()) || 0;
  // Below 300 no pid is given out again after the first cycle (the kernel's RESERVED_PIDS).
  if (!before || !now || pidMax === 0 || now.forks - before.forks >= pidMax - RESERVED_PIDS) return () => true;
  const from = before.lastPid;
  const to = now.lastPid;
  return to >= from ? (pid) => pid > from && pid <= to : (pid) => pid > from || pid <= to;
}

/** The children of `pid`, by all its threads (/proc/<pid>/task/<tid>/children). */
function childrenOf(pid: number): number[] {
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  const children: number[] = [];
  for (const tid of tasks) {
    const text = readProcFile(`/proc/${pid}/task/${tid}/children`);
    if (text) for (const child of text.trim().split(' ')) if (child !== '') children.push(Number(child));
  }
  return children;
}

/**
 * Where a sandbox process's orphans go: the nearest ancestor that is a child subreaper, or
 * init. Every ancestor of a sandbox process outside the sandbox is the starter, this worker or
 * one of the worker's ancestors, so their children are looked at (the starter's: processes
 * started whose pid has not reached the index yet).
 */
function reapers(): number[] {
  const found = [process.pid];
  const starter = spawnerPid();
  if (starter !== undefined) found.push(starter);
  for (let pid = process.pid; pid > 1;) {
    const parent = processStat(pid)?.ppid;
    if (parent === undefined || parent === 0 || found.includes(parent)) break;
    found.push(parent);
    pid = parent;
  }
  if (!found.includes(1)) found.push(1);
  return found;
}

/**
 * The live processes of one sandbox: those indexed, their descendants (whatever they set in
 * their environment or argv, and whether or not they left the process group or session), and
 * orphans handed to a reaper that carry the sandbox's marker or are still in one of its
 * sessions. An orphan that left the session and cleared its marker before the worker looked
 * is not found; only a cgroup or a pid namespace holds against that (README).
 */
async function walkSandbox(marker: SandboxMarker): Promise<Look> {
  const key = keyOf(marker);
  const tracked = trackedOf(key);
  const cursor = lookAtOrphans();
  const queue: number[] = [];
  queue.push(...tracked.pids.keys());
  const found: ProcessInfo[] = [];
  const seen = new Set<number>();
  const sessions = new Set<number>();
  const groups = new Set<number>();
  while (queue.length > 0) {
    const pid = queue.pop()!;
    if (seen.has(pid)) continue;
    seen.add(pid);
    const stat = processStat(pid);
    const startTime = tracked.pids.get(pid);
    if (
      !stat ||
      (startTime !== undefined && stat.startTime !== startTime) ||
      stat.state === 'Z' ||
      stat.state === 'X'
    ) {
      if (startTime !== undefined && (!stat || stat.startTime !== startTime)) forget(key, pid);
      continue;
    }
    if (startTime === undefined) adopt(key, pid, stat);
    found.push({ pid, state: stat.state });
    sessions.add(stat.session);
    // A group in one of the sandbox's sessions has only the sandbox's processes: no other can join that session.
    if (tracked.sessions.has(stat.session)) groups.add(stat.group);
    queue.push(...childrenOf(pid));
  }
  // Sessions are learned only from what the starter started (or a full scan found led by the
  // sandbox's own process), never from an orphan adopted by its marker, which may be forged. One
  // that a look finds no process of is kept until its id may name another session (`sessionOwners`).
  for (const session of tracked.sessions) {
    if (sessions.has(session)) {
      confirmSession(session, key, cursor);
      // Its first group, the leader's: what the sandbox's processes fork stays in it unless they move.
      groups.add(session);
    } else if (sessionOwner(session, cursor) !== key) {
      tracked.sessions.delete(session);
    }
    // A session this look found no process of is not signalled as a group: its id may name a new
    // session by now that nothing has shown yet. `signalSessions` looks at each of its processes.
  }
  // A sandbox with no process or session left needs no entry: one started later makes a new one.
  if (found.length === 0 && tracked.sessions.size === 0) index.delete(key);
  if (known.size > KNOWN_LIMIT) pruneKnown();
  return { found, groups: [...groups], sessions: new Set(tracked.sessions) };
}

/** Markers remembered beyond this many are checked for processes that have gone. */
const KNOWN_LIMIT = 10_000;

function pruneKnown(): void {
  for (const [pid, { startTime }] of known) if (processStat(pid)?.startTime !== startTime) known.delete(pid);
}

function forget(key: string, pid: number): void {
  index.get(key)?.pids.delete(pid);
  if (owners.get(pid)?.key === key) owners.delete(pid);
}

/** What `markerOfProcess` returns for a process whose environment reads empty. */
const UNREAD = Symbol('unread');

/**
 * A process's marker, read once per process (pid and start time) as the full scan does. An
 * environment that reads empty is UNREAD and not remembered: during execve it reads empty, and
 * the same process (same pid and start time) then shows its marker; remembered as none, it
 * escaped every later look and kill. One cleared on purpose (`env -i`) is read again each time.
 */
function markerOfProcess(
  pid: number,
  stat: NonNullable<ReturnType<typeof processStat>>,
): SandboxMarker | undefined | typeof UNREAD {
  const cached = known.get(pid);
  if (cached?.startTime === stat.startTime) return cached.marker;
  const environ = readEnviron(pid);
  if (environ === '') return UNREAD;
  const marker = markerIn(environ);
  // A child of this worker or of its starter may be between fork and exec, with its parent's environment.
  if (marker || (stat.ppid !== process.pid && stat.ppid !== spawnerPid()))
    known.set(pid, { startTime: stat.startTime, marker });
  return marker;
}

function withStates(pids: number[]): ProcessInfo[] {
  return pids.flatMap((pid) => {
    const stat = processStat(pid);
    return stat ? [{ pid, state: stat.state }] : [];
  });
}

/** Lets a frozen sandbox run again. */
export async function thawSandbox(marker: SandboxMarker): Promise<void> {
  if (cgroupTracking()) return thawGroup(marker);
  await thawFound(marker, look);
}

async function thawFound(marker: SandboxMarker, find: (marker: SandboxMarker) => Promise<Look>): Promise<void> {
  const { found, groups, sessions } = await find(marker);
  for (const group of groups) sendSignal(-group, 'SIGCONT');
  for (const { pid } of found) sendSignal(pid, 'SIGCONT');
  signalSessions(keyOf(marker), sessions, 'SIGCONT');
}

/**
 * Freezes every process of the sandbox: by its cgroup, or by SIGSTOP to its process groups and
 * to each process found until a look after every group was stopped finds nothing running, so one
 * forked meanwhile is caught too.
 */
export async function freezeSandbox(marker: SandboxMarker, timeoutMs = 10_000): Promise<void> {
  if (cgroupTracking()) return freezeGroup(marker, timeoutMs);
  await freezeFound(marker, timeoutMs, look);
}

async function freezeFound(
  marker: SandboxMarker,
  timeoutMs: number,
  find: (marker: SandboxMarker) => Promise<Look>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const stopped = new Set<number>();
  for (;;) {
    const { found, groups, sessions } = await find(marker);
    const running = found.filter((p) => p.state !== 'T' && p.state !== 't');
    const caught = signalSessions(keyOf(marker), sessions, 'SIGSTOP');
    if (running.length === 0 && caught === 0 && groups.every((group) => stopped.has(group))) {
      const left = find === indexedLook ? (await strays(marker)).filter((p) => p.state !== 'T' && p.state !== 't') : [];
      if (left.length === 0) return;
      for (const { pid } of left) sendSignal(pid, 'SIGSTOP');
      continue;
    }
    // A group with no member gets none: no process can join a group that does not exist.
    for (const group of groups) {
      sendSignal(-group, 'SIGSTOP');
      stopped.add(group);
    }
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
  if (!cgroupTracking()) await killFound(marker, timeoutMs, look);
  await killGroup(marker, timeoutMs);
  // A killed sandbox needs no entry (with cgroups nothing walks the index, which alone dropped one:
  // every sandbox that ever started a process stayed in it, ~0.5 KiB per Run in heap snapshots).
  dropIndexed(keyOf(marker));
}

function dropIndexed(key: string): void {
  const tracked = index.get(key);
  if (!tracked) return;
  for (const pid of tracked.pids.keys()) if (owners.get(pid)?.key === key) owners.delete(pid);
  for (const session of tracked.sessions) if (sessionOwners.get(session)?.key === key) sessionOwners.delete(session);
  index.delete(key);
}

async function killFound(
  marker: SandboxMarker,
  timeoutMs: number,
  find: (marker: SandboxMarker) => Promise<Look>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let emptyLooks = 0;
  for (;;) {
    const { found: alive, groups, sessions } = await find(marker);
    // Every group on every look, whether a member was found or not (a zombie, which cannot be told
    // from a live member by the signal's result, keeps a group until its parent reaps it).
    for (const group of groups) sendSignal(-group, 'SIGKILL');
    const caught = signalSessions(keyOf(marker), sessions, 'SIGKILL');
    // Done after two empty looks in a row: a process forked while its parent was being killed can be
    // in no listing for a moment (its pid taken, not yet in /proc, or on its way to a new parent).
    if (alive.length === 0 && caught === 0 && (emptyLooks += 1) >= 2) {
      const left = find === indexedLook ? await strays(marker) : [];
      if (left.length === 0) return;
      for (const { pid } of left) sendSignal(pid, 'SIGKILL');
      emptyLooks = 0;
      continue;
    }
    if (alive.length === 0) {
      if (caught > 0) emptyLooks = 0;
      await sleep(10);
      continue;
    }
    emptyLooks = 0;
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

/**
 * What a scan of all of /proc finds of the sandbox once its looks find nothing left to signal,
 * adopted into the index. A chain that starts a new session each generation keeps its marker but
 * none of the sandbox's sessions, and its one live process can be on its way from a parent that
 * exited to init during every look; a scan in pid order does not follow parents, and meets each
 * generation ahead of it (a child's pid comes after its parent's until pids wrap).
 */
async function strays(marker: SandboxMarker): Promise<ProcessInfo[]> {
  const key = keyOf(marker);
  const before = pidCursor();
  const found = (await scanByEnvironment(marker.hostId)).get(marker.sandboxId) ?? [];
  seeded(marker.hostId, new Map([[marker.sandboxId, found]]), before);
  // Only what the index now holds as the sandbox's: a forged marker does not win over a session.
  return found.filter(({ pid }) => owners.get(pid)?.key === key);
}

/** The environment scan alone, whatever the host offers: for the tests of that fallback. */
export const byEnvironment = {
  processes: async (marker: SandboxMarker) => (await scanByEnvironment(marker.hostId)).get(marker.sandboxId) ?? [],
  kill: (marker: SandboxMarker) => killFound(marker, 10_000, environmentLook),
};

/** The index (what a worker without cgroups uses), whatever the host offers: for the tests of it. */
export const byIndex = {
  processes: indexedProcesses,
  kill: async (marker: SandboxMarker) => {
    await killFound(marker, 10_000, indexedLook);
    dropIndexed(keyOf(marker));
  },
  freeze: (marker: SandboxMarker) => freezeFound(marker, 10_000, indexedLook),
  thaw: (marker: SandboxMarker) => thawFound(marker, indexedLook),
  /** How many sandboxes, processes and sessions the index holds. */
  size: () => index.size + owners.size + sessionOwners.size,
};

/**
 * Sends `signal` to every process in one of `sessions`, and returns how many it reached that were
 * neither stopped nor zombies. A look through the index can miss a process that forks and exits
 * faster than the look (its child is between two parents), and one that moved to a group of its
 * own escapes the groups' signals. This looks at all of /proc instead, then at each pid handed out
 * since the listing began, in the order they were handed out, until it has caught up: what a
 * process forks while it is looked for is looked at after it. Kills and freezes only: no process
 * can join a session, so a session of the sandbox holds nothing else, unless its id was handed out
 * again unseen; a process outside the sandbox's pids group shows that (`provesReused`), and the
 * session is dropped before anything in it is signalled.
 */
function signalSessions(key: string, ofSandbox: ReadonlySet<number>, signal: NodeJS.Signals): number {
  if (ofSandbox.size === 0) return 0;
  const sessions = new Set(ofSandbox);
  let reached = 0;
  const visit = (pid: number) => {
    const stat = processStat(pid);
    if (!stat || !sessions.has(stat.session) || stat.state === 'Z' || stat.state === 'X') return;
    if (provesReused(key, pid, stat)) {
      forgetSession(stat.session);
      sessions.delete(stat.session);
      return;
    }
    sendSignal(pid, signal);
    if (signal !== 'SIGSTOP' || (stat.state !== 'T' && stat.state !== 't')) reached += 1;
  };
  let at = lastPid();
  for (const name of readdirSync('/proc')) if (/^[0-9]+$/.test(name)) visit(Number(name));
  pidMax ??= Number(readProcFile('/proc/sys/kernel/pid_max')?.trim()) || 0;
  for (let round = 0; at !== undefined && pidMax > 0 && round < CATCH_UP_ROUNDS; round += 1) {
    const last = lastPid();
    if (last === undefined || last === at) break;
    // Pids are handed out upwards and start again above the kernel's 300 reserved ones.
    for (let pid = at; pid !== last;) {
      pid = pid + 1 >= pidMax ? RESERVED_PIDS : pid + 1;
      visit(pid);
    }
    at = last;
  }
  return reached;
}

/** Bounds the catching up of `signalSessions` when the host forks faster than it looks; the kill looks again. */
const CATCH_UP_ROUNDS = 1000;
const RESERVED_PIDS = 300;

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
  const environ = readProcFile(`/proc/${pid}/environ`);
  if (environ !== undefined) return environ;
  // A process whose main thread exited has no environ at its pid; its live threads share the memory it is read from.
  const thread = liveThread(pid);
  return thread === undefined ? undefined : readProcFile(`/proc/${pid}/task/${thread.tid}/environ`);
}
