import { existsSync, readFileSync, rmdirSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import fc from 'fast-check';
import { hierarchies, killGroup } from '../../providers/cgroups';
import { confine, joined, resolveLimits, type Limiter } from '../../providers/limits';
import { startProcess, type SpawnRequest } from '../../providers/spawner';
import { context, uniqueId, waitFor } from './helpers';
import { makeHost, sh } from './harness';

// The confining start (limits.ts): a shell joins the sandbox's groups, takes the limits no group
// enforces (dash's ulimit where the host has dash, else prlimit) and execs the command. Real
// processes, real cgroupfs: the two ways must give a command exactly the same limits.

const marker = () => ({ hostId: uniqueId('cf-host'), sandboxId: uniqueId('cf-sbx') });

const start = (command: { file: string; args: string[] }, extra: Partial<SpawnRequest> = {}) =>
  startProcess({
    ...command,
    cwd: os.tmpdir(),
    env: { PATH: '/usr/bin:/bin' },
    background: false,
    maxOutputBytes: 64 * 1024,
    ...extra,
  });

const members = (file: string) => readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number);

/** Kills what is left in the marker's groups and removes them and its host's (empty) groups. */
async function removeGroups(m: { hostId: string; sandboxId: string }, join: string[]): Promise<void> {
  await killGroup(m, 5000); // which may remove them itself
  for (const file of join.filter((f) => existsSync(f))) {
    await waitFor('the group to empty', async () => members(file).length === 0);
    rmdirSync(path.dirname(file));
  }
  const { v2, v1 } = hierarchies();
  for (const base of [v2, v1.pids, v1.cpu]) {
    const host = base && path.join(base, `h-${m.hostId}`);
    if (host && existsSync(host)) rmdirSync(host);
  }
}

/** The soft and hard values of the limits a confine sets, as /proc/<pid>/limits shows them. */
function limitLines(text: string): string[] {
  return text
    .split('\n')
    .filter((line) => /^Max (file size|address space|processes) /.test(line))
    .map((line) => line.replace(/\s+/g, ' ').trim());
}

it('dash’s ulimit and prlimit give a started command exactly the same limits, or both refuse to start it', async () => {
  const m = marker();
  let join: string[] = [];
  try {
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          fileMiB: fc.integer({ min: 1, max: 16_777_216 }),
          memoryMiB: fc.integer({ min: 64, max: 16_777_216 }),
          processes: fc.integer({ min: 16, max: 1_000_000 }),
        }),
        async (drawn) => {
          const limits = resolveLimits(drawn);
          const outcome = async (via: Limiter) => {
            const confined = confine(m, limits, { file: '/bin/cat', args: ['/proc/self/limits'] }, via);
            join = confined.join;
            const started = await start(confined);
            await joined(started.pid, confined.join);
            const exit = await started.exited;
            return { ran: exit.code === 0, limits: exit.code === 0 ? limitLines(exit.stdout) : [] };
          };
          const [byUlimit, byPrlimit] = [await outcome('ulimit'), await outcome('prlimit')];
          expect(byUlimit).toEqual(byPrlimit);
          if (byUlimit.ran) {
            const bytes = String(drawn.fileMiB * 1024 * 1024);
            expect(byUlimit.limits).toContain(`Max file size ${bytes} ${bytes} bytes`);
          }
        },
      ),
      { numRuns: 25 },
    );
  } finally {
    await removeGroups(m, join);
  }
});

it('a sandbox’s environment does not change the limits its processes start with', async () => {
  const host = await makeHost();
  const sandboxId = uniqueId('cf-env');
  // What the confining shell sees of the sandbox: its env reaches it. None of these may loosen a limit.
  const env = { IFS: '-0123456789', PATH: '/nonexistent', ENV: '/nonexistent/rc', ULIMIT: '-f unlimited' };
  const limits = { fileMiB: 3, memoryMiB: 1024, processes: 77 };
  await host.provider.provision({ sandboxId, fence: 1, env, limits }, context());
  await host.provider.start({ sandboxId, fence: 1 }, context());
  const shown = await sh(host.provider, sandboxId, '/bin/cat /proc/self/limits');
  expect(limitLines(shown)).toContain(`Max file size ${3 * 1024 * 1024} ${3 * 1024 * 1024} bytes`);
  await host.provider.release(
    { sandboxId, idempotencyKey: uniqueId('rel'), mode: 'TERMINATE', fence: 2, reason: 'test' },
    context(),
  );
});
