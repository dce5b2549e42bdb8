import { execFile } from 'node:child_process';
import { accessSync, constants, lstatSync, readlinkSync } from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { StasisError } from '../common/errors';
import type { ProviderDeps, SandboxProvider } from './api';
import { sandboxEnv, SYSTEM_PATH, type CommandWrapper } from './command';
import { createLocalProvider, type LocalProviderOptions } from './local';
import { markerOnly } from './processes';

// The `bwrap` provider: the local provider with every command (and the init
// process) inside bubblewrap: own pid and network namespaces, a read-only view
// of the system, and only this sandbox's directories, at /workspace,
// /home/sandbox and /envs. Other sandboxes and the data dir are not visible.
// A sandbox outlives the worker that started it (no --die-with-parent), as a
// local one does: the next worker finds its processes and adopts them.

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
  return args;
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
  for (const dir of dirs) {
    const candidate = path.join(dir, 'bwrap');
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  throw new StasisError(
    'NOT_SUPPORTED',
    `the bwrap provider needs bubblewrap (bwrap) on this host; none in ${dirs.join(':')}`,
  );
}

/**
 * Commands inside bubblewrap. The launcher itself runs on the host, so nothing of the
 * sandbox reaches it: it is started by absolute path, in `/`, with a fixed environment
 * (PATH and the sandbox's marker only); the sandbox's environment is set inside with
 * --clearenv/--setenv.
 */
export function bubblewrapCommands(bwrapPath?: string): CommandWrapper {
  const mounts = systemMounts();
  let file: string | undefined;
  const resolve = () => (file ??= findBwrap(bwrapPath));
  let available: Promise<void> | undefined;
  return {
    check() {
      available ??= Promise.resolve()
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
        '--unshare-net',
        '--unshare-ipc',
        '--unshare-uts',
        // Root inside keeps no capability: it cannot mount a cgroup fs to leave its group, nor raise its limits.
        '--cap-drop',
        'ALL',
        ...mounts,
        '--proc',
        '/proc',
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
      return { file: resolve(), args, cwd: '/', env: { PATH: SYSTEM_PATH, ...markerOnly(env) } };
    },
  };
}

export function createBwrapProvider(
  deps: ProviderDeps,
  options: Omit<LocalProviderOptions, 'name' | 'commands'> = {},
): SandboxProvider {
  return createLocalProvider(deps, { ...options, name: 'bwrap', commands: bubblewrapCommands() });
}
