import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import fc from 'fast-check';
import { readState, sandboxPaths } from '../../providers/sandbox-state';
import { context, stasisError, tempDir, uniqueId } from './helpers';
import { makeHost, sh } from './harness';

// A provision names which provisioning it is (provisionId: the provisioning workflow's run id). A
// failed or cancelled Run keeps its sandbox (a dormant copy, its state, an active workspace's link):
// a later Run of the same id, once the namespace has forgotten the first, provisions the same
// sandbox id and must not be handed that workspace, env and fences as if it were a retry.

const releaseAt = (sandboxId: string, mode: 'TERMINATE' | 'SNAPSHOT_AND_TERMINATE', fence: number) => ({
  sandboxId,
  idempotencyKey: `${sandboxId}/${fence}/release`,
  mode,
  fence,
  reason: 'test',
});

test('a provision under another provisionId is refused and leaves the kept sandbox as it was; a retry of the first is admitted', async () => {
  const host = await makeHost();
  const sandboxId = uniqueId('sbx');
  const first = { sandboxId, fence: 1, provisionId: 'run-one', env: { API_KEY: 'first-only' } };
  await host.provider.provision(first, context());
  await host.provider.start({ sandboxId, fence: 1 }, context());
  await sh(host.provider, sandboxId, 'echo SECRET-OF-RUN-1 > secret.txt');
  await host.provider.release(releaseAt(sandboxId, 'SNAPSHOT_AND_TERMINATE', 1), context());
  const paths = sandboxPaths(host.dataDir, sandboxId);
  const before = await readState(paths);

  const refused = await stasisError(
    host.provider.provision({ sandboxId, fence: 1, provisionId: 'run-two' }, context()),
    'INVALID_STATE_TRANSITION',
  );
  expect(refused.message).toContain(`sandbox ${sandboxId} already exists`);
  expect(await readState(paths)).toEqual(before);
  expect(await fs.readFile(path.join(paths.workspace, 'secret.txt'), 'utf8')).toBe('SECRET-OF-RUN-1\n');

  // The first provisioning's own retry finds its sandbox, as before.
  await host.provider.provision(first, context());
  expect((await readState(paths))?.provisionedBy).toBe('run-one');
});

test('an active workspace kept by one Run is refused to a later provisioning of its id, naming the sandbox rather than a fence', async () => {
  const host = await makeHost();
  const hostDir = await tempDir('kept-active');
  const sandboxId = uniqueId('sbx');
  await host.provider.provision(
    { sandboxId, fence: 1, provisionId: 'admin-run', workspace: { kind: 'active', hostPath: hostDir } },
    context(),
  );
  await host.provider.start({ sandboxId, fence: 1 }, context());
  await host.provider.release(releaseAt(sandboxId, 'TERMINATE', 1), context());
  await host.provider.attach({ sandboxId, fence: 2 }, context()); // the first Run went on: fence 2 seen

  const refused = await stasisError(
    host.provider.provision({ sandboxId, fence: 1, provisionId: 'agent-run' }, context()),
    'INVALID_STATE_TRANSITION',
  );
  expect(refused.message).not.toContain('fence');
  expect(await fs.readdir(hostDir)).toEqual([]);
});

test('a sandbox provisioned before provisionIds existed is not handed to a provisioning that names one', async () => {
  const host = await makeHost();
  const sandboxId = await host.sandbox({ env: { TOKEN: 'old' } });
  await stasisError(
    host.provider.provision({ sandboxId, fence: 1, provisionId: 'new-run' }, context()),
    'INVALID_STATE_TRANSITION',
  );
  // A caller that names none (as before) retries as it did.
  await host.provider.provision({ sandboxId, fence: 1 }, context());
});

test('property: of any sequence of provisions of one sandbox id, exactly those naming the first one’s provisionId are admitted', async () => {
  const host = await makeHost();
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.constantFrom<string | undefined>('a', 'b', 'c', undefined), { minLength: 1, maxLength: 5 }),
      async (ids) => {
        const sandboxId = uniqueId('sbx');
        for (const provisionId of ids) {
          const call = host.provider.provision(
            { sandboxId, fence: 1, ...(provisionId ? { provisionId } : {}) },
            context(),
          );
          if (provisionId === ids[0]) await call;
          else await stasisError(call, 'INVALID_STATE_TRANSITION');
        }
        await host.provider.destroy({ sandboxId, fence: 1 }, context());
      },
    ),
    { numRuns: 15 },
  );
});
