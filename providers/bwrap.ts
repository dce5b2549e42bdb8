import { execFile } from 'node:child_process';
import { lstatSync, readlinkSync } from 'node:fs';
import { promisify } from 'node:util';
import { StasisError } from '../common/errors';
import type { ProviderDeps, SandboxProvider } from './api';
import type { CommandWrapper } from './command';
import { createLocalProvider, type LocalProviderOptions } from './local';

// The `bwrap` provider: the local provider with every command (and the init
// process) inside bubblewrap: own pid and network namespaces, a read-only view
// of the system, and only this sandbox's directories, at /workspace,
// /home/sandbox and /envs. Other sandboxes and the data dir are not visible.

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

export function bubblewrapCommands(bwrapPath = 'bwrap'): CommandWrapper {
  const mounts = systemMounts();
  let available: Promise<void> | undefined;
  return {
    check() {
      available ??= promisify(execFile)(bwrapPath, ['--version']).then(
        () => undefined,
        (err: unknown) => {
          available = undefined; // installing bubblewrap later fixes it without a worker restart
          throw new StasisError(
            'NOT_SUPPORTED',
            `the bwrap provider needs bubblewrap (${bwrapPath}) on this host: ${err instanceof Error ? err.message : String(err)}`,
          );
        },
      );
      return available;
    },
    wrap(paths, argv) {
      const args = [
        '--unshare-pid',
        '--unshare-net',
        '--unshare-ipc',
        '--unshare-uts',
        '--die-with-parent',
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
        '--',
        ...argv,
      ];
      return { file: bwrapPath, args, home: SANDBOX_HOME };
    },
  };
}

export function createBwrapProvider(
  deps: ProviderDeps,
  options: Omit<LocalProviderOptions, 'name' | 'commands'> = {},
): SandboxProvider {
  return createLocalProvider(deps, { ...options, name: 'bwrap', commands: bubblewrapCommands() });
}
