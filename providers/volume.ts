import { accessSync, constants } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { StasisError } from '../common/errors';
import { hasErrorCode } from '../stores/atomic-file';
import { SYSTEM_PATH } from './command';
import { removeTree } from './files';
import type { SandboxPaths } from './sandbox-state';
import { startProcess } from './spawner';

// A sandbox's files (workspace, home, envs) live on their own volume: a sparse ext4
// image (`volume.img` in the sandbox root) loop-mounted at `volume/`, so a sandbox
// that fills its disk gets ENOSPC at its own limit instead of filling the host's
// disk (and making the worker evict its neighbours' copies). Mounted nosuid,nodev:
// nothing on it becomes a setuid program or a device. Mounting needs root and loop
// devices; where the host has neither, `volume/` is a plain directory (README,
// "Sandbox processes and limits", says what is then enforced).

/** `auto`: a volume where the host can mount one; `required`: refuse sandboxes otherwise; `off`: never. */
export type VolumeMode = 'auto' | 'required' | 'off';

/** Where a sandbox made by an earlier version keeps its trees: directly in its root. */
const LEGACY_TREES = ['workspace', 'home', 'envs'];
const TOOLS = ['mkfs.ext4', 'mount', 'umount'];

let unsupported: string | undefined | null = null;

/** Why this host cannot mount sandbox volumes, or undefined when it can. */
export function volumeSupport(): string | undefined {
  if (unsupported !== null) return unsupported;
  unsupported = undefined;
  if (process.getuid?.() !== 0) unsupported = 'the worker does not run as root';
  else if (!canAccess('/dev/loop-control')) unsupported = 'the host has no loop devices (/dev/loop-control)';
  else {
    const missing = TOOLS.filter((tool) => !SYSTEM_PATH.split(':').some((dir) => canAccess(`${dir}/${tool}`)));
    if (missing.length > 0) unsupported = `${missing.join(', ')} not found in ${SYSTEM_PATH}`;
  }
  return unsupported;
}

function canAccess(file: string): boolean {
  try {
    accessSync(file, constants.F_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * Runs mkfs/mount/umount through the process starter (spawner.ts), as sandbox processes are
 * started: a spawn from the worker forks the whole worker and blocks its event loop for tens of
 * milliseconds at its size, and every sandbox's provision, release, resume and destroy runs these.
 */
async function tool(file: string, args: string[]): Promise<void> {
  let exit;
  try {
    const started = await startProcess({
      file,
      args,
      cwd: '/',
      env: { PATH: SYSTEM_PATH },
      background: false,
      maxOutputBytes: 64 * 1024,
    });
    exit = await started.exited;
  } catch (err) {
    throw new ToolError(file, args, err instanceof Error ? err.message : String(err), '', { cause: err });
  }
  if (exit.code !== 0) {
    const stderr = exit.stderr.trim();
    throw new ToolError(file, args, stderr || `exit ${exit.signal ?? `code ${exit.code}`}`, stderr);
  }
}

class ToolError extends Error {
  constructor(
    file: string,
    args: string[],
    why: string,
    /** What the tool itself wrote to stderr ('' when it did not run). */
    readonly stderr: string,
    options?: ErrorOptions,
  ) {
    super(`${file} ${args.join(' ')} failed: ${why}`, options);
  }
}

/** Cleared once a mkfs.ext4 (e2fsprogs before 1.47) refuses the option. */
let prezeroedOption = true;

/**
 * Formats the fresh image. It is a sparse file, so it reads as zeros: told so
 * (assume_storage_prezeroed), mkfs does not write the journal's zeros (64 MiB of a 10 GiB
 * volume, at every provision) and marks the inode tables zeroed, so the kernel does not
 * write their zeros after the mount either. No blocks reserved for root: the sandbox gets
 * exactly its size, whoever it runs as.
 */
async function format(image: string): Promise<void> {
  const args = (extended: string) => ['-q', '-F', '-m', '0', '-E', extended, image];
  if (prezeroedOption) {
    try {
      await tool('mkfs.ext4', args('nodiscard,assume_storage_prezeroed=1'));
      return;
    } catch (err) {
      if (!(err instanceof ToolError && err.stderr.includes('assume_storage_prezeroed'))) throw err;
      prezeroedOption = false;
    }
  }
  await tool('mkfs.ext4', args('nodiscard'));
}

/** Whether `paths.volume` is a mount point (another device than the sandbox root). */
export async function isMounted(paths: SandboxPaths): Promise<boolean> {
  const [root, volume] = await Promise.all([fs.stat(paths.root), fs.lstat(paths.volume).catch(() => undefined)]);
  return volume !== undefined && volume.dev !== root.dev;
}

async function exists(file: string): Promise<boolean> {
  return fs.lstat(file).then(
    () => true,
    (err: unknown) => {
      if (hasErrorCode(err, 'ENOENT')) return false;
      throw err;
    },
  );
}

/**
 * Makes `paths.volume` ready for a new sandbox's trees: a mounted volume of `sizeMiB`
 * (created the first time), or a plain directory where `mode` allows one. Safe to run
 * again after an interruption anywhere: the image only gets its name once formatted.
 */
export async function prepareVolume(paths: SandboxPaths, sizeMiB: number, mode: VolumeMode): Promise<void> {
  await fs.mkdir(paths.root, { recursive: true });
  await mountVolume(paths);
  if (await exists(paths.volumeImage)) return;
  // Files already here without an image: a sandbox of a host without volumes keeps its plain directory.
  if (mode === 'off' || (await exists(paths.volume))) {
    await fs.mkdir(paths.volume, { recursive: true });
    return;
  }
  const reason = volumeSupport();
  if (reason !== undefined) {
    if (mode === 'required') {
      throw new StasisError('NOT_SUPPORTED', `sandbox volumes are required (STASIS_SANDBOX_VOLUMES) but ${reason}`);
    }
    await fs.mkdir(paths.volume, { recursive: true });
    return;
  }
  const fresh = `${paths.volumeImage}.new`;
  await fs.rm(fresh, { force: true });
  await fs.writeFile(fresh, '');
  await fs.truncate(fresh, sizeMiB * 1024 * 1024); // sparse: takes disk only as the sandbox writes
  await format(fresh);
  await fs.rename(fresh, paths.volumeImage);
  await mountVolume(paths);
}

/**
 * Makes an existing sandbox's trees reachable at their paths: mounts its volume if it has
 * one that is not mounted (after a host restart), and moves the trees of a sandbox made
 * before sandboxes had volumes (directly in its root) into `volume/`.
 */
export async function mountVolume(paths: SandboxPaths): Promise<void> {
  if (!(await exists(paths.volumeImage))) {
    for (const name of LEGACY_TREES) {
      const legacy = path.join(paths.root, name);
      if (!(await exists(legacy))) continue;
      await fs.mkdir(paths.volume, { recursive: true });
      await fs.rename(legacy, path.join(paths.volume, name));
    }
    return;
  }
  await fs.mkdir(paths.volume, { recursive: true });
  if (await isMounted(paths)) return;
  await tool('mount', ['-t', 'ext4', '-o', 'loop,nosuid,nodev,noatime', paths.volumeImage, paths.volume]);
}

/**
 * Unmounts the sandbox's volume (its image stays): a sandbox whose compute is released holds
 * no mount and no loop device while it waits; the next call that needs its files mounts it again.
 */
export async function unmountVolume(paths: SandboxPaths): Promise<void> {
  if (!(await exists(paths.volume))) return;
  while (await isMounted(paths)) {
    // Lazily when still busy (a process that outlived the kill holds a file): detached now, freed when closed.
    await tool('umount', [paths.volume]).catch(() => tool('umount', ['--lazy', paths.volume]));
  }
}

/** Unmounts the sandbox's volume and deletes its image; the caller removes the rest of the root. */
export async function releaseVolume(paths: SandboxPaths): Promise<void> {
  await unmountVolume(paths);
  await fs.rm(paths.volumeImage, { force: true });
  await fs.rm(`${paths.volumeImage}.new`, { force: true });
}

/** Removes a sandbox's directory, its volume first (a mount point cannot be removed). */
export async function removeSandboxDir(paths: SandboxPaths): Promise<void> {
  await releaseVolume(paths);
  await removeTree(paths.root);
}
