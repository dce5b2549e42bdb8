import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { killSandbox } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context } from './helpers';
import { sh } from './harness';
import { snapshot, volumeHost } from './volume-hosts';

// Attacks on the unchanged re-suspend (snapshot.ts recordUnchanged/repeatIfUnchanged): faults that
// leave the files different from the checkpoint the stamp names, so that a repeat would lose data.

test('a resume retried after the worker died between starting compute and writing the state keeps what ran meanwhile', async () => {
  const host = await volumeHost();
  const other = await volumeHost(host.store);
  const id = await host.sandbox();
  await sh(host.provider, id, 'echo first > a.txt');
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  const paths = sandboxPaths(host.dataDir, id);
  // The state as the release left it on disk: dormant, stopped.
  const released = await fs.readFile(paths.stateFile);
  await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
  // The compute runs and writes; the worker is killed before restoreLocked's writeState (local.ts, after
  // ensureCompute): on disk the state is still the released one; the processes end with the worker.
  await sh(host.provider, id, 'echo written-before-the-crash > a.txt', 3);
  await killSandbox({ hostId: host.hostId, sandboxId: id });
  await fs.writeFile(paths.stateFile, released);
  // The orchestrator retries the resume, then releases.
  await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
  const second = (await host.provider.release(snapshot(id, 4), context())).checkpoint!;
  await other.provider.restore({ sandboxId: id, fence: 5, checkpoint: second }, context());
  const restored = await fs.readFile(path.join(sandboxPaths(other.dataDir, id).volume, 'workspace', 'a.txt'), 'utf8');
  expect(restored).toBe('written-before-the-crash\n');
}, 120_000);

test('a single 512-byte sector written with O_DIRECT in place (less than the count’s KiB) takes the walk', async () => {
  const host = await volumeHost();
  const other = await volumeHost(host.store);
  const id = await host.sandbox();
  await sh(host.provider, id, 'head -c 65536 /dev/zero > z.bin');
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
  // One sector: lifetime_write_kbytes counts sectors/2, so a lone odd sector alone may not move it.
  await sh(
    host.provider,
    id,
    'printf x | dd of=z.bin bs=512 count=1 seek=3 oflag=direct conv=notrunc,sync status=none',
    3,
  );
  const second = (await host.provider.release(snapshot(id, 4), context())).checkpoint!;
  expect(second.sha256).not.toBe(first.sha256);
  await other.provider.restore({ sandboxId: id, fence: 5, checkpoint: second }, context());
  const bytes = await fs.readFile(path.join(sandboxPaths(other.dataDir, id).volume, 'workspace', 'z.bin'));
  expect(bytes.subarray(3 * 512, 3 * 512 + 1).toString()).toBe('x');
}, 120_000);
