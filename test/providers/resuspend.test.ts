import { spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { Checkpoint } from '../../common/schemas';
import type { SandboxReleaseReceipt } from '../../providers/api';
import { unmountIdleVolumes, withLifecycleLock } from '../../providers/maintenance';
import { readState, sandboxesDir, sandboxPaths } from '../../providers/sandbox-state';
import { context, mountsUnder, waitFor } from './helpers';
import { sh, type Host } from './harness';
import { snapshot, volumeHost } from './volume-hosts';

// A release leaves two steps for after its receipt (local.ts, `afterReceipt`): writing the next
// checkpoint's baseline and unmounting the sandbox's volume. These tests attack that laziness: a
// worker killed between the receipt and those steps loses nothing (an older baseline stays sound,
// host maintenance unmounts), and a restore on the same host while they are pending is correct.

/** Releases in a process of its own that is SIGKILLed right after the receipt (resuspend-kill.ts). */
async function releaseAndDie(host: Host, sandboxId: string, fence: number): Promise<SandboxReleaseReceipt> {
  const child = spawn(
    process.execPath,
    [
      '-r',
      path.join(__dirname, '..', '..', 'scripts', 'register-ts.js'),
      path.join(__dirname, 'resuspend-kill.ts'),
      host.dataDir,
      host.hostId,
      sandboxId,
      String(fence),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const signal = await new Promise((resolve) => child.on('exit', (_code, sig) => resolve(sig)));
  expect({ signal, output }).toMatchObject({ signal: 'SIGKILL', output: expect.stringContaining('RECEIPT ') });
  return JSON.parse(/RECEIPT (.*)/.exec(output)![1]) as SandboxReleaseReceipt;
}

const baselineUri = async (host: Host, sandboxId: string) =>
  (
    JSON.parse(
      await fs.readFile(path.join(sandboxPaths(host.dataDir, sandboxId).meta, 'checkpoint-baseline.json'), 'utf8'),
    ) as {
      uri: string;
    }
  ).uri;

/**
 * A sandbox released once (its baseline written, its volume unmounted), resumed from its local copy and
 * changed, then released by a worker killed right after the receipt: the new checkpoint stands, the
 * baseline on disk is still the first one's and the volume is still mounted.
 */
async function killedAfterReceipt(host: Host): Promise<{ id: string; first: Checkpoint; second: Checkpoint }> {
  const id = await host.sandbox();
  await sh(host.provider, id, 'echo one > a.txt; echo same > c.txt; head -c 300000 /dev/urandom > r.bin');
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  const paths = sandboxPaths(host.dataDir, id);
  await waitFor('the first release unmounted', async () => mountsUnder(paths.root).length === 0);
  expect(await baselineUri(host, id)).toBe(first.uri);
  expect((await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context())).source).toBe(
    'local-copy',
  );
  await sh(host.provider, id, 'echo two > a.txt', 3);

  const receipt = await releaseAndDie(host, id, 4);
  expect(receipt).toMatchObject({ computeReleased: true, duplicate: false });
  const second = receipt.checkpoint!;
  // Killed between the receipt and what it leaves: still mounted, and the baseline is the older one.
  expect(mountsUnder(paths.root)).toEqual([paths.volume]);
  expect(await baselineUri(host, id)).toBe(first.uri);
  expect(await readState(paths)).toMatchObject({ status: 'stopped', dormant: { checkpoint: second } });
  expect(await host.provider.processCount(id)).toBe(0);
  return { id, first, second };
}

/** Resumes `checkpoint` on `host` with a restarted worker, changes a file, re-suspends, and checks the result elsewhere. */
async function resumeChangeAndCheck(host: Host, id: string, checkpoint: Checkpoint, fence: number): Promise<void> {
  const worker = host.restart();
  const paths = sandboxPaths(host.dataDir, id);
  expect((await worker.restore({ sandboxId: id, fence, checkpoint }, context())).source).toBe('local-copy');
  expect(await sh(worker, id, 'cat a.txt c.txt', fence)).toBe('two\nsame\n');
  const sum = await sh(worker, id, 'echo three > b.txt; sha256sum r.bin', fence);
  // Taken with the older baseline (the first checkpoint's): each change since is in it all the same.
  const third = (await worker.release(snapshot(id, fence + 1), context())).checkpoint!;
  await waitFor('the re-suspend unmounted', async () => mountsUnder(paths.root).length === 0);
  expect(await baselineUri(host, id)).toBe(third.uri);
  const other = await volumeHost(host.store);
  const moved = await other.provider.restore({ sandboxId: id, fence: fence + 2, checkpoint: third }, context());
  expect(moved.source).toBe('checkpoint');
  expect(await sh(other.provider, id, 'cat a.txt b.txt c.txt; sha256sum r.bin', fence + 2)).toBe(
    `two\nthree\nsame\n${sum}`,
  );
  await other.provider.destroy({ sandboxId: id, fence: fence + 3 }, context());
  await worker.destroy({ sandboxId: id, fence: fence + 3 }, context());
  expect(mountsUnder(host.dataDir)).toEqual([]);
}

test('a worker killed between the receipt and the unmount: host maintenance unmounts, and the sandbox resumes and re-suspends whole', async () => {
  const host = await volumeHost();
  const { id, second } = await killedAfterReceipt(host);
  const paths = sandboxPaths(host.dataDir, id);
  expect(await unmountIdleVolumes(sandboxesDir(host.dataDir))).toEqual([id]);
  expect(mountsUnder(host.dataDir)).toEqual([]);
  // A second pass finds nothing left to do.
  expect(await unmountIdleVolumes(sandboxesDir(host.dataDir))).toEqual([]);
  expect(await readState(paths)).toMatchObject({ status: 'stopped', dormant: { checkpoint: second } });
  await resumeChangeAndCheck(host, id, second, 5);
});

test('a worker killed between the receipt and the unmount: a resume on the same host before any maintenance uses the mounted copy', async () => {
  const host = await volumeHost();
  const { id, second } = await killedAfterReceipt(host);
  await resumeChangeAndCheck(host, id, second, 5);
});

test('a restore that comes while a release’s unmount is pending keeps the volume mounted under its compute', async () => {
  const host = await volumeHost();
  const id = await host.sandbox();
  await sh(host.provider, id, 'echo kept > k.txt');
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  const paths = sandboxPaths(host.dataDir, id);
  await waitFor('the first release unmounted', async () => mountsUnder(paths.root).length === 0);
  // A second release of the dormant copy (another key) returns its checkpoint and leaves an unmount; the
  // restore is queued behind it, so it runs before that unmount would.
  const again = host.provider.release(snapshot(id, 3), context());
  const restored = host.provider.restore({ sandboxId: id, fence: 4, checkpoint: first }, context());
  expect((await again).checkpoint).toEqual(first);
  expect((await restored).source).toBe('local-copy');
  // Once whatever the release left has had its turn (a lock holder queued now runs after it), the volume the
  // restored compute runs on is still mounted: not detached under it (a lazy unmount) to be mounted again beside it.
  await withLifecycleLock(id, async () => undefined);
  expect(mountsUnder(paths.root)).toEqual([paths.volume]);
  expect(await sh(host.provider, id, 'cat k.txt; echo more >> k.txt; cat k.txt', 4)).toBe('kept\nkept\nmore\n');
  expect(mountsUnder(paths.root)).toEqual([paths.volume]);
  expect(await host.provider.processCount(id)).toBe(1);
  const next = (await host.provider.release(snapshot(id, 5), context())).checkpoint!;
  await waitFor('the release unmounted', async () => mountsUnder(paths.root).length === 0);
  const other = await volumeHost(host.store);
  await other.provider.restore({ sandboxId: id, fence: 6, checkpoint: next }, context());
  expect(await sh(other.provider, id, 'cat k.txt', 6)).toBe('kept\nmore\n');
  await other.provider.destroy({ sandboxId: id, fence: 7 }, context());
  await host.provider.destroy({ sandboxId: id, fence: 7 }, context());
  await host.provider.close();
  expect(mountsUnder(host.dataDir)).toEqual([]);
});
