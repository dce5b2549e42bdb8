import { execFile } from 'node:child_process';
import { existsSync, lstatSync, readdirSync, readlinkSync, type Stats } from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { StasisError } from '../common/errors';
import type { ProviderDeps, SandboxProvider } from './api';
import { sandboxEnv, SYSTEM_PATH, type CommandWrapper } from './command';
import { findExecutable } from './executables';
import { createLocalProvider, type LocalProviderOptions } from './local';
import { markerOnly } from './processes';
import { sandboxSeccompProgram } from './seccomp';

// The `bwrap` provider: the local provider with every command (and the init
// process) inside bubblewrap: own pid and network namespaces, a read-only view
// of the system, and only this sandbox's directories, at /workspace,
// /home/sandbox and /envs. Other sandboxes and the data dir are not visible.
// A sandbox outlives the worker that started it (no --die-with-parent), as a
// local one does: the next worker finds its processes and adopts them.
// Its processes run as the worker's uid, with no capability and under a seccomp
// filter (seccomp.ts) that refuses setuid/setgid modes, the kernel keyrings and io_uring.

const SANDBOX_HOME = '/home/sandbox';

/** System directories; on merged-/usr systems /bin, /lib... are symlinks into /usr and are recreated as such. */
const SYSTEM_DIRS = ['/usr', '/bin', '/sbin', '/lib', '/lib64', '/lib32', '/etc'];

function systemMounts(): string[] {
  const args: string[] = [];
  for (const dir of SYSTEM_DIRS) {
    let isLink: boolean;
    try {
      isLink = lstatSync(dir).isSymbolicLink();
    } catch {
      continue; // absent on this host (e.g. /lib32)
    }
    if (isLink) args.push('--symlink', readlinkSync(dir), dir);
    else args.push('--ro-bind', dir, dir);
  }
  return [...args, ...privateMasks('/etc')];
}

/**
 * The sandbox's own /proc still reaches the host's kernel: root (even with no capability) may write
 * every sysctl (kernel.core_pattern runs a program as host root on the next crash) and
 * /proc/sysrq-trigger (reboots the host). /proc/sys is bound read-only, and the files that only
 * expose or poke the host's kernel are covered where the host has them (as container runtimes do).
 */
function procfsCovers(): string[] {
  const hidden = ['sysrq-trigger', 'kcore', 'keys', 'timer_list', 'sched_debug', 'latency_stats']
    .map((name) => `/proc/${name}`)
    .filter((file) => existsSync(file));
  return ['--ro-bind', '/proc/sys', '/proc/sys', ...hidden.flatMap((file) => ['--ro-bind', '/dev/null', file])];
}

/**
 * Covers every entry under `root` that an unprivileged user could not read (/etc/shadow,
 * /etc/ssl/private, ...): a sandbox's processes run as the worker's user, which may be root,
 * and root keeps its owner rights on root's files even with no capability. Files are covered
 * by /dev/null (on bubblewrap's nodev mounts, not even openable), directories by an empty
 * read-only tmpfs. /etc is where a host keeps its secrets; the other system directories hold
 * software, readable by everyone.
 */
export function privateMasks(root: string): string[] {
  const masks: string[] = [];
  const walk = (dir: string) => {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      return;
    }
    for (const name of names) {
      const entry = path.join(dir, name);
      let stat: Stats;
      try {
        stat = lstatSync(entry);
      } catch {
        continue; // gone meanwhile
      }
      if (stat.isDirectory()) {
        if ((stat.mode & 0o005) !== 0o005) masks.push('--tmpfs', entry, '--remount-ro', entry);
        else walk(entry);
      } else if (!stat.isSymbolicLink() && (stat.mode & 0o004) === 0) {
        masks.push('--ro-bind', '/dev/null', entry);
      }
    }
  };
  walk(root);
  return masks;
}

/**
 * The absolute path of `bwrap`: `configured` when given (it must be absolute), otherwise the first
 * executable `bwrap` in the absolute entries of the worker's PATH and the system directories. A
 * relative PATH entry would resolve against the sandbox's workspace (the launcher's old cwd).
 */
function findBwrap(configured: string | undefined): string {
  if (configured !== undefined) {
    if (!path.isAbsolute(configured))
      throw new StasisError('NOT_SUPPORTED', `bwrap path ${configured} must be absolute`);
    return configured;
  }
  const dirs = [...(process.env.PATH ?? '').split(':'), ...SYSTEM_PATH.split(':')].filter((d) => path.isAbsolute(d));
  const found = findExecutable('bwrap', dirs);
  if (found) return found;
  throw new StasisError(
    'NOT_SUPPORTED',
    `the bwrap provider needs bubblewrap (bwrap) on this host; none in ${dirs.join(':')}`,
  );
}

/**
 * Commands inside bubblewrap. The launcher itself runs on the host, so nothing of the
 * sandbox reaches it: it is started by absolute path, in `/`, with a fixed environment
 * (PATH and the sandbox's marker only); the sandbox's environment is set inside with
 * --clearenv/--setenv. `network: true` keeps the host's network (for EXTERNAL jobs, whose work is
 * calling services); everything else stays as closed. Every process runs under the seccomp filter of
 * seccomp.ts, which bwrap reads from descriptor 3 (a pipe the process starter fills; bwrap closes it
 * once read, so the sandbox never holds it); on an architecture the filter has no table for,
 * check() and wrap() fail with NOT_SUPPORTED.
 */
export function bubblewrapCommands(bwrapPath?: string, options: { network?: boolean } = {}): CommandWrapper {
  const mounts = systemMounts();
  const procCovers = procfsCovers();
  let file: string | undefined;
  const resolve = () => (file ??= findBwrap(bwrapPath));
  let available: Promise<void> | undefined;
  return {
    check() {
      available ??= Promise.resolve()
        .then(() => sandboxSeccompProgram())
        .then(() => promisify(execFile)(resolve(), ['--version'], { env: { PATH: SYSTEM_PATH }, cwd: '/' }))
        .then(
          () => undefined,
          (err: unknown) => {
            const tried = file ?? bwrapPath ?? 'bwrap';
            available = undefined; // installing bubblewrap later fixes it without a worker restart
            file = undefined;
            if (err instanceof StasisError) throw err;
            throw new StasisError(
              'NOT_SUPPORTED',
              `the bwrap provider needs bubblewrap (${tried}) on this host: ${err instanceof Error ? err.message : String(err)}`,
            );
          },
        );
      return available;
    },
    wrap(paths, argv, env) {
      const setenv = Object.entries(sandboxEnv(SANDBOX_HOME, env)).flatMap(([name, value]) => [
        '--setenv',
        name,
        value,
      ]);
      const args = [
        '--unshare-pid',
        ...(options.network ? [] : ['--unshare-net']),
        '--unshare-ipc',
        '--unshare-uts',
        // Root inside keeps no capability: it cannot mount a cgroup fs to leave its group, nor raise its limits.
        '--cap-drop',
        'ALL',
        '--seccomp',
        '3',
        ...mounts,
        '--proc',
        '/proc',
        ...procCovers,
        '--dev',
        '/dev',
        '--tmpfs',
        '/tmp',
        '--bind',
        paths.workspace,
        '/workspace',
        '--bind',
        paths.home,
        SANDBOX_HOME,
        '--bind',
        paths.envs,
        '/envs',
        '--chdir',
        '/workspace',
        '--clearenv',
        ...setenv,
        '--',
        ...argv,
      ];
      return {
        file: resolve(),
        args,
        cwd: '/',
        env: { PATH: SYSTEM_PATH, ...markerOnly(env) },
        fd3: sandboxSeccompProgram(),
      };
    },
  };
}

export function createBwrapProvider(
  deps: ProviderDeps,
  options: Omit<LocalProviderOptions, 'name' | 'commands'> = {},
): SandboxProvider {
  return createLocalProvider(deps, { ...options, name: 'bwrap', commands: bubblewrapCommands() });
}
