import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import type { ProviderDeps, SandboxProvider } from '../../providers/api';
import { createBwrapProvider } from '../../providers/bwrap';
import { createLocalProvider } from '../../providers/local';
import { evictUnderPressure } from '../../providers/maintenance';
import { sandboxesDir, sandboxPaths } from '../../providers/sandbox-state';
import { volumeSupport } from '../../providers/volume';
import { context, mountsUnder, stasisError, uniqueId, waitFor } from './helpers';
import { makeHost, sh, type Host } from './harness';

// Each sandbox's files on their own volume (a loop-mounted ext4 image of its
// diskMiB): a disk filler stops at its own limit, and the host, the worker and
// its neighbours never notice. These tests need root and loop devices (CI has both).

const DISK_MIB = 64;
const MIB = 1024 * 1024;

/** Loop devices whose backing file lies under `dir`. */
function loopsUnder(dir: string): string[] {
  return readdirSync('/sys/block')
    .filter((name) => name.startsWith('loop'))
    .flatMap((name) => {
      try {
        return [readFileSync(`/sys/block/${name}/loop/backing_file`, 'utf8').trim()];
      } catch {
        return []; // not attached
      }
    })
    .filter((file) => file.startsWith(`${dir}/`));
}

async function create(host: Host, sandboxId: string): Promise<void> {
  await host.provider.provision({ sandboxId, fence: 1, limits: { diskMiB: DISK_MIB } }, context());
  await host.provider.start({ sandboxId, fence: 1 }, context());
}

async function exec(provider: SandboxProvider, sandboxId: string, command: string, fence = 1) {
  return provider.exec({ sandboxId, fence, jobId: uniqueId('job'), command }, context());
}

/** Writes zeros to `file` until the disk refuses; returns the outcome. */
const FILL = (file: string) => `dd if=/dev/zero of=${file} bs=1M count=${DISK_MIB * 4}`;

const hosts: Host[] = [];
const volumeHost = async (options: Parameters<typeof makeHost>[0]) => {
  const host = await makeHost(options);
  hosts.push(host);
  return host;
};

// A failed test leaves its sandboxes: their volumes are unmounted here, so nothing stays mounted on the machine.
afterAll(() => {
  for (const host of hosts) {
    for (const point of mountsUnder(host.dataDir)) execFileSync('umount', ['--lazy', point]);
  }
});

test('this host can mount sandbox volumes (root and loop devices)', () => {
  expect(volumeSupport()).toBeUndefined();
});

describe.each([
  ['local', createLocalProvider],
  ['bwrap', createBwrapProvider],
] as const)('a %s sandbox on its own volume', (_name, factory) => {
  const make = (deps: ProviderDeps) => factory({ ...deps, volumes: 'required' });

  test('a disk filler gets ENOSPC at its limit; the worker and a neighbour keep working; its files survive suspend, resume and a restore elsewhere', async () => {
    const host = await volumeHost({ make });
    const filler = uniqueId('sbx');
    const neighbour = uniqueId('sbx');
    for (const id of [filler, neighbour]) await create(host, id);
    const before = Buffer.from(`written before by the file API ${filler}`);
    await host.provider.writeFile({ sandboxId: filler, fence: 1, path: 'before.txt', content: before }, context());
    const sum = await sh(host.provider, filler, 'head -c 4000000 /dev/urandom > random.bin; sha256sum random.bin');

    const filled = await exec(host.provider, filler, FILL('fill'));
    expect(filled.exitCode).not.toBe(0);
    expect(filled.stderr).toContain('No space left on device');
    // Home is on the same volume: no way around the limit there.
    const home = await exec(host.provider, filler, FILL('$HOME/fill'));
    expect(home.stderr).toContain('No space left on device');
    const image = await fs.stat(sandboxPaths(host.dataDir, filler).volumeImage);
    expect(image.blocks * 512).toBeLessThanOrEqual(DISK_MIB * MIB);

    // The worker: a write that does not fit is a clear 413 and leaves nothing; one to the neighbour succeeds.
    const refused = await stasisError(
      host.provider.writeFile({ sandboxId: filler, fence: 1, path: 'late.txt', content: Buffer.alloc(MIB) }, context()),
      'PAYLOAD_TOO_LARGE',
    );
    expect(refused.message).toContain('late.txt');
    expect(await sh(host.provider, filler, 'ls -a')).not.toContain('late.txt');
    await host.provider.writeFile(
      { sandboxId: neighbour, fence: 1, path: 'n.txt', content: Buffer.alloc(MIB, 1) },
      context(),
    );
    expect(await sh(host.provider, neighbour, 'head -c 8000000 /dev/zero > more.bin; wc -c < n.txt')).toBe('1048576\n');

    // Suspend and resume on this host: the files come back from the local copy, the limit with them.
    const suspended = await host.provider.release(
      { sandboxId: filler, idempotencyKey: `${filler}/2`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    // Unmounted right after the receipt (not before it: the unmount is no part of the checkpoint).
    await waitFor(
      'the released volume unmounted',
      async () => mountsUnder(sandboxPaths(host.dataDir, filler).root).length === 0,
    );
    await host.provider.restore({ sandboxId: filler, fence: 3, checkpoint: suspended.checkpoint! }, context());
    expect(
      (await host.provider.readFile({ sandboxId: filler, fence: 3, path: 'before.txt' }, context())).equals(before),
    ).toBe(true);
    expect(await sh(host.provider, filler, 'sha256sum random.bin', 3)).toBe(sum);
    expect((await exec(host.provider, filler, FILL('fill2'), 3)).stderr).toContain('No space left on device');

    // Restored on another host, from the checkpoint: on a new volume of the same size.
    await sh(host.provider, filler, 'rm fill fill2 $HOME/fill', 3);
    const moved = await host.provider.release(
      { sandboxId: filler, idempotencyKey: `${filler}/4`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 4, reason: 'test' },
      context(),
    );
    const other = await volumeHost({ make, store: host.store });
    await other.provider.restore(
      { sandboxId: filler, fence: 5, checkpoint: moved.checkpoint!, limits: { diskMiB: DISK_MIB } },
      context(),
    );
    expect(await sh(other.provider, filler, 'cat before.txt; sha256sum random.bin', 5)).toBe(`${before}${sum}`);
    expect((await exec(other.provider, filler, FILL('fill'), 5)).stderr).toContain('No space left on device');
    for (const [at, id] of [
      [other, filler],
      [host, neighbour],
    ] as const) {
      await at.provider.destroy({ sandboxId: id, fence: 9 }, context());
    }
    await host.provider.destroy({ sandboxId: filler, fence: 9 }, context());
  });

  test('a worker restart (or a host reboot) finds the volume and mounts it again before touching the files', async () => {
    const host = await volumeHost({ make });
    const id = uniqueId('sbx');
    await create(host, id);
    await sh(host.provider, id, 'echo kept > kept.txt');
    const { volume } = sandboxPaths(host.dataDir, id);
    await host.provider.stop({ sandboxId: id, fence: 1 }, context());
    // Stopped: no mount held. A write now must not land on the bare mount point (where the mount would hide it).
    expect(mountsUnder(host.dataDir)).toEqual([]);
    const restarted = host.restart();
    await restarted.writeFile({ sandboxId: id, fence: 1, path: 'after.txt', content: Buffer.from('after') }, context());
    await restarted.start({ sandboxId: id, fence: 1 }, context());
    expect(await sh(restarted, id, 'cat kept.txt after.txt')).toBe('kept\nafter');
    expect(mountsUnder(host.dataDir)).toEqual([volume]);
    await restarted.destroy({ sandboxId: id, fence: 1 }, context());
  });

  test('evicting a dormant copy under disk pressure removes its image with it', async () => {
    const host = await volumeHost({ make });
    const id = uniqueId('sbx');
    await create(host, id);
    await sh(host.provider, id, 'echo data > file');
    await host.provider.release(
      { sandboxId: id, idempotencyKey: `${id}/2`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    // Any call on the copy (here a file read by a restarted worker, refused on a dormant copy) mounts it again:
    // eviction must unmount it. (An attach would bring its compute back.)
    await stasisError(
      host.restart().readFile({ sandboxId: id, fence: 2, path: 'file' }, context()),
      'INVALID_STATE_TRANSITION',
    );
    expect(mountsUnder(host.dataDir)).toEqual([sandboxPaths(host.dataDir, id).volume]);
    const result = await evictUnderPressure({
      sandboxesDir: sandboxesDir(host.dataDir),
      minFreeBytes: 1,
      freeBytes: async () => ((await fs.readdir(sandboxesDir(host.dataDir))).length > 0 ? 0 : 2),
    });
    expect(result.evicted).toEqual([id]);
    expect(mountsUnder(host.dataDir)).toEqual([]);
    expect(loopsUnder(host.dataDir)).toEqual([]);
    await expect(fs.lstat(sandboxPaths(host.dataDir, id).root)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  test('a new volume is formatted without writing zeros: a default-size (10 GiB) image takes a few MiB of disk, and is a whole filesystem', async () => {
    const host = await volumeHost({ make });
    const id = uniqueId('sbx');
    await host.provider.provision({ sandboxId: id, fence: 1 }, context());
    await host.provider.start({ sandboxId: id, fence: 1 }, context());
    const paths = sandboxPaths(host.dataDir, id);
    expect(await sh(host.provider, id, 'head -c 3000000 /dev/urandom > r.bin; sync; wc -c < r.bin')).toBe('3000000\n');
    // Stopped, the volume is unmounted: its image is checked as a host reboot would find it.
    await host.provider.stop({ sandboxId: id, fence: 1 }, context());
    const image = await fs.stat(paths.volumeImage);
    expect(image.size).toBe(10_240 * MIB);
    // Zeroed by mkfs, its 64 MiB journal alone would take 64 MiB: the fresh sparse file already reads as zeros.
    expect(image.blocks * 512).toBeLessThan(16 * MIB);
    // -f: checked whole even though clean; -n: nothing changed. Exit 0: no problem found.
    execFileSync('e2fsck', ['-f', '-n', paths.volumeImage], { stdio: 'pipe' });
    await host.provider.destroy({ sandboxId: id, fence: 1 }, context());
    expect(mountsUnder(host.dataDir)).toEqual([]);
  });

  test('destroy leaves no mount, no loop device and no image', async () => {
    const host = await volumeHost({ make });
    const id = uniqueId('sbx');
    await create(host, id);
    // A background process keeps a file open on the volume.
    await sh(host.provider, id, 'nohup sh -c "exec 3>held; sleep 1000" >/dev/null 2>&1 &');
    const paths = sandboxPaths(host.dataDir, id);
    expect(mountsUnder(host.dataDir)).toEqual([paths.volume]);
    expect(loopsUnder(host.dataDir)).toEqual([paths.volumeImage]);
    await host.provider.destroy({ sandboxId: id, fence: 1 }, context());
    expect(mountsUnder(host.dataDir)).toEqual([]);
    expect(loopsUnder(host.dataDir)).toEqual([]);
    await expect(fs.lstat(paths.root)).rejects.toMatchObject({ code: 'ENOENT' });
  });
});

test('with volumes off, a sandbox keeps its files in a plain directory: no image, no mount', async () => {
  const host = await volumeHost({ make: (deps) => createLocalProvider({ ...deps, volumes: 'off' }) });
  const id = uniqueId('sbx');
  await create(host, id);
  expect(await sh(host.provider, id, 'echo plain > f; cat f')).toBe('plain\n');
  const paths = sandboxPaths(host.dataDir, id);
  expect(mountsUnder(host.dataDir)).toEqual([]);
  await expect(fs.lstat(paths.volumeImage)).rejects.toMatchObject({ code: 'ENOENT' });
  await host.provider.destroy({ sandboxId: id, fence: 1 }, context());
  await expect(fs.lstat(paths.root)).rejects.toMatchObject({ code: 'ENOENT' });
});
