import { accessSync, constants, type BigIntStats } from 'node:fs';
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

/**
 * syncfs(2) of the filesystem holding `dir` (`sync -f`, through the process starter: Node has no
 * syncfs). Writes back what any process wrote there, so after a restore the cost is the restore's
 * own writes on a sandbox's volume, and the host's dirty data where sandboxes have no volumes.
 */
export async function syncFilesystem(dir: string): Promise<void> {
  const started = await startProcess({
    file: 'sync',
    args: ['-f', dir],
    cwd: '/',
    env: { PATH: SYSTEM_PATH },
    background: false,
    maxOutputBytes: 64 * 1024,
  });
  const exit = await started.exited;
  if (exit.code !== 0) {
    throw new Error(`sync -f ${dir} failed: ${exit.stderr.trim() || `exit ${exit.signal ?? `code ${exit.code}`}`}`);
  }
}

/**
 * Which mount of which volume holds the sandbox's trees, and how many KiB its ext4 has written to its
 * device in its whole life (`/sys/fs/ext4/<loop>/lifetime_write_kbytes`): any change to a file, its
 * metadata or a directory is written to the device once synced, so equal counts of one mount, each
 * read after a syncfs, mean nothing on the volume changed between (README, "Change detection").
 */
export interface VolumeWrites {
  /** The loop device (`loop3`) and its `major:minor`. */
  device: string;
  devno: string;
  /** The mount's id in /proc/self/mountinfo. */
  mountId: string;
  /** The image's inode: the loop device is this sandbox's image. */
  imageIno: string;
  /**
   * The filesystem's UUID (random at each mkfs): loop device, mount id and inode numbers are reused
   * (a profile saw all three again for the next sandbox's fresh volume), and so is the count of a
   * fresh volume. One filesystem's count never comes back: it only grows, and each mount writes.
   */
  uuid: string;
  kib: string;
}

/**
 * The sandbox's volume writes, read now (sync it first), or undefined where they tell nothing: no
 * volume mounted, another filesystem, a tree that is not a directory of that very mount (an active
 * workspace lives on the host's disk), or anything unreadable. The caller then walks, as it always could.
 */
export async function volumeWrites(paths: SandboxPaths): Promise<VolumeWrites | undefined> {
  try {
    const [root, volume, image] = await Promise.all(
      [paths.root, paths.volume, paths.volumeImage].map((file) => fs.lstat(file, { bigint: true })),
    );
    if (!volume.isDirectory() || volume.dev === root.dev) return undefined;
    for (const tree of LEGACY_TREES) {
      const stat = await fs.lstat(path.join(paths.volume, tree), { bigint: true });
      if (!stat.isDirectory() || stat.dev !== volume.dev) return undefined;
    }
    const devno = devNumber(volume);
    const mountPoint = mountinfoPath(await fs.realpath(paths.volume));
    // The one mount at the volume's path, of that device, ext4 from a loop device.
    const mounts = (await fs.readFile('/proc/self/mountinfo', 'utf8'))
      .split('\n')
      .map((line) => line.split(' '))
      .filter((fields) => fields[4] === mountPoint);
    if (mounts.length !== 1) return undefined;
    const fields = mounts[0];
    const separator = fields.indexOf('-');
    const [fstype, source] = [fields[separator + 1], fields[separator + 2]];
    if (fields[2] !== devno || fstype !== 'ext4' || !/^\/dev\/loop[0-9]+$/.test(source)) return undefined;
    const device = path.basename(source);
    if (path.basename(await fs.readlink(`/sys/dev/block/${devno}`)) !== device) return undefined;
    const backing = (await fs.readFile(`/sys/block/${device}/loop/backing_file`, 'utf8')).trim();
    const backingStat = await fs.stat(backing, { bigint: true });
    if (backingStat.ino !== image.ino || backingStat.dev !== image.dev) return undefined;
    const uuid = await filesystemUuid(paths.volumeImage);
    const kib = (await fs.readFile(`/sys/fs/ext4/${device}/lifetime_write_kbytes`, 'utf8')).trim();
    if (uuid === undefined || !/^[0-9]+$/.test(kib)) return undefined;
    return { device, devno, mountId: fields[0], imageIno: image.ino.toString(), uuid, kib };
  } catch {
    return undefined;
  }
}

/**
 * The count alone, of the device `writes` names: a cheap look before a sync (the count only grows, so
 * one that moved already proves a change); undefined if unreadable. Says nothing of which volume it is.
 */
export async function writeCount(writes: VolumeWrites): Promise<string | undefined> {
  if (!/^loop[0-9]+$/.test(writes.device)) return undefined;
  return fs.readFile(`/sys/fs/ext4/${writes.device}/lifetime_write_kbytes`, 'utf8').then(
    (text) => text.trim(),
    () => undefined,
  );
}

/** Whether `a` and `b` are the same count of the same mount of the same volume. */
export function sameWrites(a: VolumeWrites, b: VolumeWrites): boolean {
  return (
    a.uuid === b.uuid &&
    a.device === b.device &&
    a.devno === b.devno &&
    a.mountId === b.mountId &&
    a.imageIno === b.imageIno &&
    a.kib === b.kib
  );
}

/** The UUID in an ext4 image's superblock (at 1024 bytes; its magic checked), or undefined. */
async function filesystemUuid(image: string): Promise<string | undefined> {
  const superblock = Buffer.alloc(0x78);
  const handle = await fs.open(image, 'r');
  try {
    const { bytesRead } = await handle.read(superblock, 0, superblock.length, 1024);
    if (bytesRead !== superblock.length || superblock.readUInt16LE(0x38) !== 0xef53) return undefined;
    return superblock.subarray(0x68, 0x78).toString('hex');
  } finally {
    await handle.close();
  }
}

/** `major:minor` of the device a stat is of (Linux's encoding of dev_t). */
function devNumber(stat: BigIntStats): string {
  const dev = stat.dev;
  const major = ((dev >> 8n) & 0xfffn) | ((dev >> 32n) & ~0xfffn);
  const minor = (dev & 0xffn) | ((dev >> 12n) & ~0xffn);
  return `${major}:${minor}`;
}

/** A path as /proc/self/mountinfo writes it (space, tab, newline and backslash in octal). */
function mountinfoPath(file: string): string {
  return file.replace(/[ \t\n\\]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, '0')}`);
}
