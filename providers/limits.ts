import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxLimits } from '../common/schemas';
import { prepareGroups, type JoinFiles } from './cgroups';
import { findExecutable } from './executables';

// Per-sandbox limits: how many processes, how much memory and CPU, how large a file, how much disk
// (the size of the sandbox's volume, volume.ts).
// Each is enforced by the sandbox's control group where the host delegates one
// (cgroups.ts), otherwise by a resource limit (prlimit) on every process the sandbox
// starts. What is enforced where on which host is in the README ("Sandbox processes and limits").

export type ResolvedLimits = Required<SandboxLimits>;

/** What a sandbox gets unless its RunSpec or create request says otherwise. */
export const DEFAULT_LIMITS: ResolvedLimits = {
  processes: 1024,
  memoryMiB: 8192,
  cpus: 1,
  fileMiB: 10_240,
  diskMiB: 10_240,
};

export function resolveLimits(override: SandboxLimits | undefined): ResolvedLimits {
  return { ...DEFAULT_LIMITS, ...override };
}

const MIB = 1024 * 1024;

/** Writes itself into every cgroup.procs file before `--`; never runs the command untracked. */
const JOIN = 'for f; do [ "$f" = -- ] && break; echo 0 > "$f" || exit 126; shift; done; shift; ';
/** Then takes each `-<letter> <value>` limit before the next `--` with the shell's own ulimit (dash's letters). */
const ULIMIT = 'while [ "$1" != -- ]; do ulimit "$1" "$2" || exit 126; shift 2; done; shift; ';

/** How a start takes its limits: with dash's ulimit, or by exec'ing prlimit. */
export type Limiter = 'ulimit' | 'prlimit';

let dash: string | undefined | null = null;

/**
 * dash, where the host has it, sets the limits itself: one exec less per start than prlimit (~0.7 ms of CPU and
 * prlimit's libraries), and its ulimit sets the soft and the hard limit, as prlimit does. Other shells' ulimit
 * letters differ (bash's -p is the pipe size), so elsewhere /bin/sh execs prlimit.
 */
function dashPath(): string | undefined {
  if (dash === null) dash = findExecutable('dash', ['/usr/bin', '/bin']);
  return dash;
}

let prlimit: string | undefined;

function prlimitPath(): string {
  prlimit ??= findExecutable('prlimit', ['/usr/bin', '/bin']);
  if (!prlimit) throw new Error('sandbox limits need prlimit (util-linux) at /usr/bin/prlimit');
  return prlimit;
}

/**
 * `command` as it must be started so that it runs confined: it first writes itself into
 * the sandbox's control groups (so it and everything it forks are tracked and limited
 * before it runs a single instruction of the command), then takes the resource limits no
 * group enforces (`via` either way: the same limits), then execs the command.
 */
export function confine(
  marker: { sandboxId: string; hostId: string },
  limits: ResolvedLimits,
  command: { file: string; args: string[] },
  via: Limiter = dashPath() ? 'ulimit' : 'prlimit',
): { file: string; args: string[]; join: JoinFiles } {
  const { join, enforced } = prepareGroups(marker, limits);
  // In bytes (prlimit) or in ulimit's units: 512-byte blocks, KiB.
  const rlimits: [flag: string, letter: string, value: number, unit: number][] = [
    ['--fsize', '-f', limits.fileMiB * MIB, 512],
  ];
  if (!enforced.has('memoryMiB')) rlimits.push(['--as', '-v', limits.memoryMiB * MIB, 1024]);
  // RLIMIT_NPROC counts every process of the user, and not at all for root: only a fallback.
  if (!enforced.has('processes')) rlimits.push(['--nproc', '-p', limits.processes, 1]);
  const ulimit = via === 'ulimit';
  const shell = ulimit ? dashPath() : '/bin/sh';
  if (!shell) throw new Error('limits by ulimit need dash');
  const limiting = ulimit
    ? [...rlimits.flatMap(([, letter, value, unit]) => [letter, String(value / unit)]), '--']
    : [prlimitPath(), ...rlimits.map(([flag, , value]) => `${flag}=${value}`), '--'];
  return {
    join,
    file: shell,
    args: [
      '-c',
      `${JOIN}${ulimit ? ULIMIT : ''}exec "$@"`,
      'stasis-confine',
      ...join,
      '--',
      ...limiting,
      command.file,
      ...command.args,
    ],
  };
}

/**
 * Resolves once the started process `pid` is in every group of `join`, or has ended (it
 * could not join: it exits 126 without running the command). Until then a scan of the
 * sandbox would not count it, so a start is not reported before.
 */
export async function joined(pid: number, join: JoinFiles): Promise<void> {
  const member = (file: string) => {
    try {
      return readFileSync(file, 'utf8').split('\n').includes(String(pid));
    } catch {
      return false;
    }
  };
  for (;;) {
    if (join.every(member)) return;
    let state: string | undefined;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
    } catch {
      return; // gone
    }
    if (state === 'Z' || state === 'X') return;
    await sleep(1);
  }
}
