import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { evictDormantCopies } from '../helpers/hosts';
import { startStack, useStack } from '../helpers/stack';

// A resume whose restore runs out of disk fails, leaving the sandbox suspended, rather than
// retrying for as long as the disk stays full (restores have no attempt limit) while nothing else,
// destroy included, may change the sandbox. The worker's data directory is a small filesystem of
// this test's own, which the test fills while the sandbox is suspended.

let disk: { image: string; mount: string };

const stack = useStack(async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'stasis-full-disk-'));
  disk = { image: path.join(dir, 'disk.img'), mount: path.join(dir, 'mnt') };
  await fs.mkdir(disk.mount);
  execFileSync('truncate', ['-s', '192M', disk.image]);
  execFileSync('mkfs.ext4', ['-q', '-m', '0', disk.image]);
  execFileSync('mount', ['-o', 'loop', disk.image, disk.mount]);
  const before = process.env.STASIS_TEST_DATA_DIR;
  process.env.STASIS_TEST_DATA_DIR = disk.mount;
  try {
    return await startStack({ hostId: 'host-a', env: { STASIS_SANDBOX_VOLUMES: 'off' } });
  } finally {
    if (before === undefined) delete process.env.STASIS_TEST_DATA_DIR;
    else process.env.STASIS_TEST_DATA_DIR = before;
  }
});

afterAll(async () => {
  if (!disk) return;
  // The stack may still hold files there: detached now, gone once it lets go.
  execFileSync('umount', ['--lazy', disk.mount]);
  await fs.rm(path.dirname(disk.image), { recursive: true, force: true });
});

const c = () => stack.client.sandboxes;

test('a resume that runs out of disk fails UNAVAILABLE, leaving the sandbox suspended; once there is room it resumes', async () => {
  const { sandboxId: id } = await c().create({ provider: 'local' });
  await c().start(id);
  const made = await c().exec(id, { command: 'head -c 40M /dev/urandom > data.bin && sha256sum data.bin' });
  expect(made.exitCode).toBe(0);
  await expect(c().suspend(id)).resolves.toMatchObject({ state: 'suspended' });
  expect(await evictDormantCopies(stack)).toContain(id);

  // All but 4 MiB of the data directory's filesystem taken: the checkpoint's 40 MiB do not fit.
  const filler = path.join(disk.mount, 'filler');
  const { bavail, bsize } = await fs.statfs(disk.mount);
  execFileSync('fallocate', ['-l', String(bavail * bsize - 4 * 1024 * 1024), filler]);
  const failed = await Promise.race([
    c()
      .resume(id)
      .then(
        (view) => ({ answered: 'resumed', state: view.state }),
        (err: { code?: string; message?: string }) => ({ answered: err.code, message: err.message }),
      ),
    new Promise((resolve) => setTimeout(() => resolve({ answered: 'nothing within 90 s' }), 90_000)),
  ]);
  expect(failed).toMatchObject({ answered: 'UNAVAILABLE', message: expect.stringMatching(/no space left/) });
  const view = await c().get(id);
  expect(view).toMatchObject({ state: 'suspended', record: { state: 'RELEASED' } });
  expect(view.record.lastError).toMatch(/no space left/);

  await fs.rm(filler);
  await expect(c().resume(id)).resolves.toMatchObject({ state: 'running' });
  const after = await c().exec(id, { command: 'sha256sum data.bin' });
  expect(after.stdout).toBe(made.stdout);
  await expect(c().destroy(id)).resolves.toMatchObject({ state: 'destroyed' });
}, 240_000);
