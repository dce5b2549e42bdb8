import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, manifest, s3StoreFromEnv } from './helpers';
import { makeHost, sh, startCounter } from './harness';

// A snapshot on one host restored on another (own data dir, own host id) through
// the real S3 store: every path, type, mode, link target and byte comes back.

/** Thousands of files, empty dirs, symlinks (a venv's among them), a hardlink, assorted modes and one 100 MB file. */
async function populate(root: string): Promise<void> {
  const workspace = path.join(root, 'workspace');
  for (let d = 0; d < 40; d += 1) {
    const dir = path.join(workspace, 'src', `pkg${d}`, 'lib');
    await fs.mkdir(dir, { recursive: true });
    await Promise.all(
      Array.from({ length: 75 }, (_, f) =>
        fs.writeFile(path.join(dir, `f${f}.txt`), randomBytes(64 + ((d * 75 + f) % 900)), {
          mode: f % 7 === 0 ? 0o755 : 0o644,
        }),
      ),
    );
  }
  for (let e = 0; e < 15; e += 1) await fs.mkdir(path.join(workspace, 'empty', `e${e}`, 'deeper'), { recursive: true });
  await fs.writeFile(path.join(workspace, 'big.bin'), randomBytes(100 * 1024 * 1024));
  await fs.writeFile(path.join(workspace, 'private.key'), 'k', { mode: 0o600 });
  await fs.chmod(path.join(workspace, 'empty', 'e3'), 0o700);
  await fs.symlink('src/pkg1/lib/f1.txt', path.join(workspace, 'link-to-file'));
  await fs.symlink('src/pkg2', path.join(workspace, 'link-to-dir'));
  await fs.symlink('not/yet/there', path.join(workspace, 'dangling-inside'));
  await fs.symlink('../home/.config', path.join(workspace, 'config'));
  await fs.link(path.join(workspace, 'private.key'), path.join(workspace, 'private.hardlink'));
  await fs.mkdir(path.join(root, 'home', '.config'), { recursive: true });
  await fs.writeFile(path.join(root, 'home', '.config', 'settings.json'), '{"a":1}');
  await fs.mkdir(path.join(root, 'envs', 'py', 'bin'), { recursive: true });
  await fs.writeFile(path.join(root, 'envs', 'py', 'bin', 'tool'), '#!/bin/sh\necho tool\n', { mode: 0o755 });
  // A Python venv as `python -m venv` lays it out: links out of the sandbox, links between its own files, dangling ones.
  const venv = path.join(root, 'envs', 'venv');
  await fs.mkdir(path.join(venv, 'bin'), { recursive: true });
  await fs.mkdir(path.join(venv, 'lib', 'python3', 'site-packages'), { recursive: true });
  await fs.writeFile(path.join(venv, 'pyvenv.cfg'), 'home = /usr/bin\n');
  await fs.symlink('/usr/bin/python3', path.join(venv, 'bin', 'python3'));
  await fs.symlink('python3', path.join(venv, 'bin', 'python'));
  await fs.symlink('lib', path.join(venv, 'lib64'));
  await fs.symlink('/nonexistent/stasis/interpreter', path.join(venv, 'bin', 'python-dangling'));
  await fs.symlink('../../../outside-of-the-sandbox', path.join(venv, 'climbing-dangling'));
  await fs.symlink('../envs/venv/bin/python', path.join(workspace, 'python'));
}

it('restores a snapshot on another host byte for byte', async () => {
  const store = s3StoreFromEnv();
  const hostA = await makeHost({ store });
  const hostB = await makeHost({ store });
  const id = await hostA.sandbox({ env: { PROJECT: 'demo' } });
  const rootA = sandboxPaths(hostA.dataDir, id).volume;
  await populate(rootA);
  await startCounter(hostA.provider, id);

  const labels = { run: 'run-hash', spec: 'spec-hash', policy: 'policy-hash' };
  const receipt = await hostA.provider.release(
    {
      sandboxId: id,
      idempotencyKey: `run/${id}/2/release`,
      mode: 'SNAPSHOT_AND_TERMINATE',
      fence: 2,
      reason: 'interaction',
    },
    context({ labels }),
  );
  expect(await hostA.provider.processCount(id)).toBe(0);
  const checkpoint = receipt.checkpoint;
  if (!checkpoint) throw new Error('no checkpoint');
  expect(checkpoint.uri).toMatch(new RegExp(`^s3://[^/]+/checkpoints/${id}/2-`));
  // The manifest of a content-addressed checkpoint; its packs hold the 100 MiB.
  expect(checkpoint.uri).toMatch(/\.manifest\.gz$/);

  const result = await hostB.provider.restore(
    { sandboxId: id, fence: 3, checkpoint, env: { PROJECT: 'demo' } },
    context(),
  );
  expect(result).toEqual({ source: 'checkpoint', labels });
  const rootB = sandboxPaths(hostB.dataDir, id).volume;
  for (const dir of ['workspace', 'home', 'envs']) {
    const [a, b] = await Promise.all([manifest(path.join(rootA, dir)), manifest(path.join(rootB, dir))]);
    expect(b.length).toBeGreaterThan(0);
    expect(b).toEqual(a);
  }
  expect((await manifest(path.join(rootB, 'workspace'))).length).toBeGreaterThan(3000);
  const [keyA, keyB] = await Promise.all(
    ['private.key', 'private.hardlink'].map((n) => fs.stat(path.join(rootB, 'workspace', n))),
  );
  expect(keyB.ino).toBe(keyA.ino);

  expect(await hostB.provider.processCount(id)).toBe(1);
  expect(await sh(hostB.provider, id, 'echo $PROJECT; ../envs/py/bin/tool; cat link-to-file | wc -c', 3)).toMatch(
    /^demo\ntool\n\s*\d+\n$/,
  );
  // The venv's interpreter runs through its absolute link, restored from the store (host B never had a local copy).
  expect(await sh(hostB.provider, id, './python -c "print(6 * 7)"; readlink ../envs/venv/bin/python3', 3)).toBe(
    '42\n/usr/bin/python3\n',
  );
  expect(await hostB.provider.listSandboxes()).toEqual([{ sandboxId: id, alive: true, dormant: false }]);
  // 100 MiB through MinIO and back on a 2-core machine that also runs the rest of the suite.
}, 300_000);
