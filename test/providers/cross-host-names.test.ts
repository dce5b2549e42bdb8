import * as path from 'node:path';
import { sandboxPaths } from '../../providers/sandbox-state';
import { rawTree } from '../helpers/raw-tree';
import { context, s3StoreFromEnv } from './helpers';
import { makeHost, sh, snapshotAndTerminate } from './harness';

// A sandbox that makes names that are not UTF-8 with its own shell (a Latin-1 checkout, `touch $'\xff'`)
// is released (compute terminated, its checkpoint in the store) and restored on another host that never
// had its files: every name, and a symlink target that is not UTF-8, comes back byte for byte. Before,
// the release was refused (CHECKPOINT_INVALID) and the sandbox's compute stayed held.

/** Octal escapes for the sandbox's `printf` (its /bin/sh may be dash: no $'\xff'). */
const MAKE_NAMES = [
  `printf 'latin-1\\n' > "$(printf 'caf\\351.txt')"`,
  `printf 'ff\\n' > "$(printf '\\377')"`,
  `mkdir "$(printf 'r\\351sum\\351')"`,
  `printf 'inner\\n' > "$(printf 'r\\351sum\\351/\\300\\257')"`,
  `ln -s "$(printf '../\\376/\\355\\262\\200')" "$(printf 'l\\375')"`,
  `printf 'real U+FFFD\\n' > "$(printf 'caf\\357\\277\\275.txt')"`,
].join(' && ');

it('names a sandbox made that are not UTF-8 are restored on another host from the store, byte for byte', async () => {
  const store = s3StoreFromEnv();
  const hostA = await makeHost({ store });
  const hostB = await makeHost({ store });
  const id = await hostA.sandbox();
  await sh(hostA.provider, id, MAKE_NAMES);
  const workspaceA = path.join(sandboxPaths(hostA.dataDir, id).volume, 'workspace');
  const before = await rawTree(workspaceA);
  expect(
    before.some((line) => line.startsWith(`${Buffer.from('caf\xe9.txt', 'latin1').toString('hex')} file 644 `)),
  ).toBe(true);
  expect(
    before.some((line) => line.startsWith(`${Buffer.from('l\xfd', 'latin1').toString('hex')} link 2e2e2ffe2fedb280`)),
  ).toBe(true);

  const receipt = await snapshotAndTerminate(hostA.provider, id, 2);
  expect(await hostA.provider.processCount(id)).toBe(0);
  const checkpoint = receipt.checkpoint;
  if (!checkpoint) throw new Error('no checkpoint');
  expect(checkpoint.uri).toMatch(/\.manifest\.gz$/);

  const result = await hostB.provider.restore({ sandboxId: id, fence: 3, checkpoint }, context());
  expect(result.source).toBe('checkpoint');
  expect(await rawTree(path.join(sandboxPaths(hostB.dataDir, id).volume, 'workspace'))).toEqual(before);
  // The sandbox on host B reads them by their bytes.
  expect(
    await sh(
      hostB.provider,
      id,
      `cat "$(printf 'caf\\351.txt')" "$(printf '\\377')" "$(printf 'r\\351sum\\351/\\300\\257')"`,
      3,
    ),
  ).toBe('latin-1\nff\ninner\n');
  expect(await sh(hostB.provider, id, `readlink "$(printf 'l\\375')" | od -An -tx1 | tr -d ' \\n'`, 3)).toBe(
    '2e2e2ffe2fedb2800a',
  );

  // Suspended again unchanged on host B: the restore's baseline vouches for every file by its escaped
  // name, so no file data goes to the store (no new pack), and the checkpoint still restores on host A.
  const packs = async () => (await store.list(`checkpoints/${id}/packs/`)).map((object) => object.key).sort();
  const packsBefore = await packs();
  expect(packsBefore.length).toBeGreaterThan(0);
  const again = await snapshotAndTerminate(hostB.provider, id, 4);
  if (!again.checkpoint) throw new Error('no checkpoint');
  expect(again.checkpoint.uri).not.toBe(checkpoint.uri);
  expect(await packs()).toEqual(packsBefore);
  const back = await hostA.provider.restore({ sandboxId: id, fence: 5, checkpoint: again.checkpoint }, context());
  expect(back.source).toBe('checkpoint');
  expect(await rawTree(workspaceA)).toEqual(before);
}, 120_000);
