import { evictDormantCopies } from '../helpers/hosts';
import { startStack, useStack } from '../helpers/stack';

// A sandbox's sparse files (sizes far above the disk they take) come back from the store onto its
// own volume: the restore once wrote their zeros out, ran out of the volume and retried for ever
// (the resume never answered, and destroy was refused meanwhile).

const stack = useStack(() => startStack({ hostId: 'host-a', env: { STASIS_SANDBOX_VOLUMES: 'required' } }));
const c = () => stack.client.sandboxes;

/** Size, KiB taken and hash of each file, and the kept file's content. */
const DESCRIBE = 'for f in sparse dotted; do stat -c "%n %s" $f; du -k $f | cut -f1; sha256sum $f; done; cat keep.txt';

test('sparse files of 200 MiB on a 64 MiB volume survive suspend, eviction of the local copy and resume from the store', async () => {
  const { sandboxId: id } = await c().create({ provider: 'local', limits: { diskMiB: 64 } });
  try {
    await c().start(id);
    const made = await c().exec(id, {
      // A hole, and a byte every MiB (every chunk of it holds data).
      command: `set -e; truncate -s 200M sparse; for i in $(seq 0 199); do printf x | dd of=dotted bs=1 seek=$((i * 1048576)) conv=notrunc status=none; done; echo keep > keep.txt; ${DESCRIBE}`,
    });
    expect(made).toMatchObject({ exitCode: 0, stderr: '' });
    await expect(c().suspend(id)).resolves.toMatchObject({ state: 'suspended' });
    expect(await evictDormantCopies(stack)).toContain(id);
    await expect(c().resume(id)).resolves.toMatchObject({ state: 'running' });
    const after = await c().exec(id, { command: DESCRIBE });
    const lines = (out: string) => out.split('\n');
    // Sizes, hashes and the kept file as they were; each file takes at most 1 MiB of disk.
    expect(lines(after.stdout).filter((_, i) => i % 3 !== 1)).toEqual(lines(made.stdout).filter((_, i) => i % 3 !== 1));
    for (const i of [1, 4]) expect(Number(lines(after.stdout)[i])).toBeLessThan(1024);
  } finally {
    await c().destroy(id);
  }
}, 240_000);
