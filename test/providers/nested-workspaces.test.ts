import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createBwrapProvider } from '../../providers/bwrap';
import { context, s3StoreFromEnv, tempDir } from './helpers';
import { makeHost, sh } from './harness';

// A sandbox owns every name in its active workspace. When another sandbox's active workspace was a
// directory in it (a child Run's workspace inside its parent's), the first sandbox could rename that
// directory and put a symlink to any host directory in its place: the second sandbox's commands then
// ran on that host directory (bwrap binds the workspace by its host path), and the worker read its
// files there. Active workspaces of one host must not nest; one directory shared by two is allowed.

const bwrapHost = () => makeHost({ make: (deps) => createBwrapProvider(deps) });

function provisionActive(host: Awaited<ReturnType<typeof makeHost>>, hostPath: string) {
  const sandboxId = `sbx-${randomBytes(4).toString('hex')}`;
  return {
    sandboxId,
    done: host.provider.provision({ sandboxId, fence: 1, workspace: { kind: 'active', hostPath } }, context()),
  };
}

it('the attack of the review: a workspace inside another sandbox’s is refused, so a swapped link reaches nothing', async () => {
  const host = await bwrapHost();
  const projects = await tempDir('projects');
  const hostOnly = await tempDir('host-only');
  await fs.writeFile(path.join(hostOnly, 'secret'), 'host secret\n');
  const outer = await host.sandbox({ hostPath: projects });
  // The inner one is refused before anything of it exists on the host.
  const inner = provisionActive(host, path.join(projects, 'app'));
  await expect(inner.done).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringMatching(
      new RegExp(`^workspace\\.hostPath: .*lies inside the active workspace of sandbox ${outer}`),
    ),
  });
  await expect(fs.access(path.join(projects, 'app'))).rejects.toMatchObject({ code: 'ENOENT' });
  expect((await host.provider.listSandboxes()).map((s) => s.sandboxId)).toEqual([outer]);
  // The outer sandbox's own swap stays its own business: no other sandbox runs there.
  await sh(host.provider, outer, `mkdir app && mv app app.gone && ln -s ${hostOnly} app`);
  await expect(
    host.provider.exec(
      { sandboxId: inner.sandboxId, fence: 1, jobId: 'j', command: 'cat /workspace/secret' },
      context(),
    ),
  ).rejects.toMatchObject({ code: 'NOT_FOUND' });
  expect(await fs.readdir(hostOnly)).toEqual(['secret']);
}, 60_000);

it('refused either way round, through a symlink, and at once; the same directory twice and siblings are not', async () => {
  const host = await makeHost();
  const root = await tempDir('nest');
  await fs.mkdir(path.join(root, 'a/b'), { recursive: true });
  await fs.symlink(path.join(root, 'a'), path.join(root, 'via'));
  // The inner one first: a later outer one is refused as well.
  const inner = await host.sandbox({ hostPath: path.join(root, 'a/b') });
  await expect(provisionActive(host, path.join(root, 'a')).done).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining(`holds the active workspace of sandbox ${inner}`),
  });
  // Spelled through a symlink, it is where the host resolves it.
  await expect(provisionActive(host, path.join(root, 'via/b/c')).done).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
  });
  // The same directory, a sibling and a look-alike prefix are not nested.
  await host.sandbox({ hostPath: path.join(root, 'a/b') });
  await host.sandbox({ hostPath: path.join(root, 'a/c') });
  await host.sandbox({ hostPath: path.join(root, 'a/b-2') });
  // Two nested provisions at once: one of them, never both.
  const x = path.join(root, 'x');
  const pair = [provisionActive(host, x), provisionActive(host, path.join(x, 'y'))];
  const outcomes = await Promise.allSettled(pair.map((p) => p.done));
  expect(outcomes.map((o) => o.status).sort()).toEqual(['fulfilled', 'rejected']);
  // Once the outer sandbox is destroyed, its directory may hold another sandbox's workspace.
  await host.provider.destroy({ sandboxId: inner, fence: 1 }, context());
  const others = (await host.provider.listSandboxes()).filter((s) => s.sandboxId !== inner);
  for (const { sandboxId } of others) await host.provider.destroy({ sandboxId, fence: 1 }, context());
  await expect(provisionActive(host, path.join(root, 'a')).done).resolves.toBeUndefined();
}, 60_000);

it('a restore onto a host where its workspace would nest is refused, and its checkpoint stays for another try', async () => {
  const store = s3StoreFromEnv();
  const hostA = await makeHost({ store });
  const hostB = await makeHost({ store });
  const root = await tempDir('nest-restore');
  const workspace = { kind: 'active', hostPath: path.join(root, 'a', 'inner') } as const;
  const id = await hostA.sandbox({ hostPath: workspace.hostPath });
  await sh(hostA.provider, id, 'echo kept > kept');
  const receipt = await hostA.provider.release(
    { sandboxId: id, idempotencyKey: `r/${id}`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'interaction' },
    context(),
  );
  if (!receipt.checkpoint) throw new Error('no checkpoint');
  // Host B holds an active workspace around the path the sandbox would come back to there.
  const outer = await hostB.sandbox({ hostPath: path.join(root, 'a') });
  await fs.rm(path.join(root, 'a', 'inner'), { recursive: true, force: true });
  await expect(
    hostB.provider.restore({ sandboxId: id, fence: 3, checkpoint: receipt.checkpoint, workspace }, context()),
  ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining(`sandbox ${outer}`) });
  expect((await hostB.provider.listSandboxes()).map((s) => s.sandboxId)).toEqual([outer]);
  // Nothing is lost: with the outer sandbox gone, the same checkpoint restores there.
  await hostB.provider.destroy({ sandboxId: outer, fence: 1 }, context());
  await hostB.provider.restore({ sandboxId: id, fence: 3, checkpoint: receipt.checkpoint, workspace }, context());
  expect(await fs.readFile(path.join(root, 'a', 'inner', 'kept'), 'utf8')).toBe('kept\n');
}, 90_000);
