import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { StasisError } from '../common/errors';
import { hasErrorCode } from '../stores/atomic-file';
import type { ResolvedLimits } from './limits';

// Control groups for sandboxes, where the host lets this worker create them.
//
// - cgroup v2 (the unified hierarchy) tracks a sandbox's processes: every process it
//   starts joins the sandbox's group before it runs, and everything it forks stays there.
//   Listing, freezing (cgroup.freeze) and killing (cgroup.kill) go by the group, never by
//   anything a sandbox process can change about itself (its environment, its process group).
//   Where the v2 pids, memory and cpu controllers are enabled for the worker's group, the
//   sandbox's limits are set on them.
// - cgroup v1 pids and cpu hierarchies (hybrid hosts, like the CI machine) carry the
//   process and CPU limits when v2 has no controllers to offer.
// Groups live below the worker's own group, in `stasis/<host>/<sandbox>`.

/** The cgroup.procs files a new process of a sandbox joins before it runs its command. */
export type JoinFiles = string[];

interface Hierarchies {
  /** The v2 base directory, when it can track (writable, with cgroup.kill and cgroup.freeze). */
  v2?: string;
  /** v1 base directories by controller (pids, cpu). */
  v1: { pids?: string; cpu?: string };
  /** How /proc/<pid>/cgroup names a directory of the v1 pids hierarchy: its mount point and the root it mounts. */
  pidsMount?: { point: string; root: string };
}

let detected: Hierarchies | undefined;

/** Which hierarchies this worker can use; probed once (a group is created and removed). */
export function hierarchies(): Hierarchies {
  detected ??= detect();
  return detected;
}

/** Whether sandboxes are tracked by cgroup (v2) on this host. */
export function cgroupTracking(): boolean {
  return hierarchies().v2 !== undefined;
}

function detect(): Hierarchies {
  const found: Hierarchies = { v1: {} };
  let mounts: string[];
  let own: string[];
  try {
    mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
    own = readFileSync('/proc/self/cgroup', 'utf8').split('\n');
  } catch {
    return found;
  }
  // The worker's group in a hierarchy, as a directory: mount point + (own path - mount root).
  const ownDir = (mountPoint: string, mountRoot: string, ownPath: string | undefined) =>
    ownPath === undefined || !ownPath.startsWith(mountRoot)
      ? undefined
      : path.join(mountPoint, path.relative(mountRoot, ownPath), 'stasis');
  for (const line of mounts) {
    const [left, right] = line.split(' - ');
    if (!left || !right) continue;
    const fields = left.split(' ');
    const [fstype, , options = ''] = right.split(' ');
    const mountRoot = fields[3];
    const mountPoint = fields[4];
    if (fstype === 'cgroup2' && !found.v2) {
      const base = ownDir(mountPoint, mountRoot, own.find((l) => l.startsWith('0::'))?.slice(3));
      if (base && usable(base, ['cgroup.kill', 'cgroup.freeze'])) found.v2 = base;
    } else if (fstype === 'cgroup') {
      for (const controller of ['pids', 'cpu'] as const) {
        if (found.v1[controller] || !options.split(',').includes(controller)) continue;
        const entry = own.find((l) => l.split(':')[1]?.split(',').includes(controller));
        const base = ownDir(mountPoint, mountRoot, entry?.split(':').slice(2).join(':'));
        if (!base || !usable(base, [controller === 'pids' ? 'pids.max' : 'cpu.cfs_quota_us'])) continue;
        found.v1[controller] = base;
        if (controller === 'pids') found.pidsMount = { point: mountPoint, root: mountRoot };
      }
    }
  }
  if (found.v2) enableControllers(found.v2);
  return found;
}

/** Whether groups can be created below `base` and have `files`. */
function usable(base: string, files: string[]): boolean {
  const probe = path.join(base, `probe-${process.pid}`);
  try {
    mkdirSync(probe, { recursive: true });
    return files.every((file) => existsSync(path.join(probe, file)));
  } catch {
    return false;
  } finally {
    try {
      rmdirSync(probe);
    } catch {
      // not created
    }
  }
}

/** Asks for the v2 controllers below `base`; those the host does not delegate are simply absent later. */
function enableControllers(base: string): void {
  for (const controller of ['pids', 'memory', 'cpu']) {
    try {
      writeFileSync(path.join(base, 'cgroup.subtree_control'), `+${controller}`);
    } catch {
      // not delegated to this worker
    }
  }
}

/** A directory name for a caller-chosen id: reversible, never `.`/`..`, never an interface file's name. */
const dirName = (prefix: string, id: string) => `${prefix}${encodeURIComponent(id)}`;

interface Marker {
  sandboxId: string;
  hostId: string;
}

function hostDir(base: string, hostId: string): string {
  return path.join(base, dirName('h-', hostId));
}

function sandboxDir(base: string, marker: Marker): string {
  return path.join(hostDir(base, marker.hostId), dirName('s-', marker.sandboxId));
}

/** Every group of the sandbox that exists or can be used on this host. */
function groupsOf(marker: Marker): { v2?: string; pids?: string; cpu?: string } {
  const { v2, v1 } = hierarchies();
  return {
    ...(v2 ? { v2: sandboxDir(v2, marker) } : {}),
    ...(v1.pids ? { pids: sandboxDir(v1.pids, marker) } : {}),
    ...(v1.cpu ? { cpu: sandboxDir(v1.cpu, marker) } : {}),
  };
}

function write(file: string, value: string): boolean {
  try {
    writeFileSync(file, value);
    return true;
  } catch {
    return false;
  }
}

/** The CFS period the CPU limit is expressed in. */
const CPU_PERIOD_US = 100_000;

/**
 * Creates the sandbox's groups with its limits set, and returns the files a new process
 * writes itself into, plus which limits the groups enforce (the rest are rlimits, see limits.ts).
 */
export function prepareGroups(
  marker: Marker,
  limits: ResolvedLimits,
): { join: JoinFiles; enforced: Set<keyof ResolvedLimits> } {
  const groups = groupsOf(marker);
  const enforced = new Set<keyof ResolvedLimits>();
  const join: JoinFiles = [];
  if (groups.v2) {
    makeGroup(groups.v2);
    enableControllers(path.dirname(groups.v2));
    if (write(path.join(groups.v2, 'pids.max'), String(limits.processes))) enforced.add('processes');
    if (write(path.join(groups.v2, 'memory.max'), String(limits.memoryMiB * 1024 * 1024))) {
      write(path.join(groups.v2, 'memory.swap.max'), '0');
      enforced.add('memoryMiB');
    }
    if (write(path.join(groups.v2, 'cpu.max'), `${Math.round(limits.cpus * CPU_PERIOD_US)} ${CPU_PERIOD_US}`))
      enforced.add('cpus');
    join.push(path.join(groups.v2, 'cgroup.procs'));
  }
  if (groups.pids && !enforced.has('processes')) {
    makeGroup(groups.pids);
    if (write(path.join(groups.pids, 'pids.max'), String(limits.processes))) enforced.add('processes');
    join.push(path.join(groups.pids, 'cgroup.procs'));
  }
  if (groups.cpu && !enforced.has('cpus')) {
    makeGroup(groups.cpu);
    write(path.join(groups.cpu, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
    if (write(path.join(groups.cpu, 'cpu.cfs_quota_us'), String(Math.round(limits.cpus * CPU_PERIOD_US))))
      enforced.add('cpus');
    join.push(path.join(groups.cpu, 'cgroup.procs'));
  }
  return { join, enforced };
}

/**
 * Creates a sandbox's group and its host's. A kill elsewhere removes an empty host group (killGroup):
 * should that fall between the two mkdirs (another worker process of the same host id), they are made again.
 */
function makeGroup(dir: string): void {
  for (let tries = 1; ; tries += 1) {
    try {
      mkdirSync(dir, { recursive: true });
      return;
    } catch (err) {
      if (!hasErrorCode(err, 'ENOENT') || tries === 3) throw err;
    }
  }
}

/**
 * Whether process `pid` is in the sandbox's v1 pids group, which every process the sandbox starts
 * joins before it runs and which nothing it forks leaves (only a write to the hierarchy moves a
 * process); undefined where the sandbox has no such group or the process is gone. Read from
 * /proc/<pid>/cgroup, which names a process's group from the moment it is forked.
 */
export function inPidsGroup(marker: Marker, pid: number): boolean | undefined {
  const { pids } = groupsOf(marker);
  const mount = hierarchies().pidsMount;
  if (!pids || !mount || !existsSync(pids)) return undefined;
  const wanted = path.join(mount.root, path.relative(mount.point, pids));
  let lines: string[];
  try {
    lines = readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n');
  } catch {
    return undefined; // gone
  }
  const line = lines.find((l) => l.split(':')[1]?.split(',').includes('pids'));
  return line === undefined ? undefined : line.split(':').slice(2).join(':') === wanted;
}

/** Pids in the sandbox's v2 group (none when it has none). */
export function groupPids(marker: Marker): number[] {
  const { v2 } = groupsOf(marker);
  return v2 ? pidsIn(v2) : [];
}

function pidsIn(dir: string): number[] {
  try {
    return readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return []; // no group: nothing started since it was last emptied
  }
}

/** Pids of every sandbox of `hostId` that has a v2 group, by sandbox id. */
export function hostGroupPids(hostId: string): Map<string, number[]> {
  const { v2 } = hierarchies();
  const found = new Map<string, number[]>();
  if (!v2) return found;
  let names: string[];
  try {
    names = readdirSync(hostDir(v2, hostId));
  } catch {
    return found;
  }
  for (const name of names) {
    if (!name.startsWith('s-')) continue;
    const pids = pidsIn(path.join(hostDir(v2, hostId), name));
    if (pids.length > 0) found.set(decodeURIComponent(name.slice(2)), pids);
  }
  return found;
}

function events(dir: string): Record<string, string> {
  try {
    return Object.fromEntries(
      readFileSync(path.join(dir, 'cgroup.events'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => l.split(' ') as [string, string]),
    );
  } catch {
    return {};
  }
}

async function until(what: string, marker: Marker, check: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  // A freeze or kill usually completes within a millisecond: looked at again soon, then less often.
  for (let wait = 1; !check(); wait = Math.min(wait * 2, 5)) {
    if (Date.now() > deadline) throw new StasisError('UNAVAILABLE', `sandbox ${marker.sandboxId}: ${what}`);
    await sleep(wait);
  }
}

/** Freezes every process of the sandbox's group, those it forks meanwhile included. */
export async function freezeGroup(marker: Marker, timeoutMs: number): Promise<void> {
  const { v2 } = groupsOf(marker);
  if (!v2 || !existsSync(v2)) return; // nothing ever ran, or it was emptied: nothing to freeze
  writeFileSync(path.join(v2, 'cgroup.freeze'), '1');
  await until('processes did not freeze', marker, () => events(v2).frozen === '1', timeoutMs);
}

export function thawGroup(marker: Marker): void {
  const { v2 } = groupsOf(marker);
  if (v2 && existsSync(v2)) writeFileSync(path.join(v2, 'cgroup.freeze'), '0');
}

/** Kills every process of the sandbox's group, waits until none is left, and removes its groups. */
export async function killGroup(marker: Marker, timeoutMs: number): Promise<void> {
  const groups = groupsOf(marker);
  if (groups.v2 && existsSync(groups.v2)) {
    const v2 = groups.v2;
    writeFileSync(path.join(v2, 'cgroup.kill'), '1');
    await until('processes survived cgroup.kill', marker, () => events(v2).populated === '0', timeoutMs);
  }
  // Emptied groups go; the next start creates them again (with the limits of that time). A v1 group
  // refuses (EBUSY) while its last killed process is still exiting (giving back its memory): waited
  // for, or a destroyed sandbox's groups would stay on the host for good.
  for (const dir of [groups.v2, groups.pids, groups.cpu]) {
    if (!dir) continue;
    await until('its group stayed busy', marker, () => removedGroup(dir), timeoutMs).catch(() => {
      // a process that will not exit: the group is reused by the next start, or left
    });
    // The host's group too once it holds no sandbox's (busy otherwise): every host id ever used kept one.
    removedGroup(path.dirname(dir));
  }
}

/** Removes an empty group; false while the kernel still counts a process in it. */
function removedGroup(dir: string): boolean {
  try {
    rmdirSync(dir);
  } catch (err) {
    return !hasErrorCode(err, 'EBUSY'); // absent, or not ours to remove
  }
  return true;
}
