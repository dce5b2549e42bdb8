import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import fc from 'fast-check';
import { hierarchies, killGroup, prepareGroups } from '../../providers/cgroups';
import { resolveLimits, type ResolvedLimits } from '../../providers/limits';
import { context, uniqueId, waitFor } from './helpers';
import { makeHost, sh } from './harness';

// Every process start prepares the sandbox's groups with its limits (cgroups.ts). These try to make a
// start use a group that is not what the sandbox's limits say: limits changed between starts, groups
// removed behind the worker's back or by a kill, a limit file rewritten by the sandbox (a `local`
// sandbox runs as the worker's uid). Real cgroupfs. (Groups kept from one start to the next were
// tried and left: ~0.3 ms a start, and a rewritten limit would then have stayed.)

const dirsOf = (join: string[]) => join.map((file) => path.dirname(file));

/** The value of the first of `files` found in the groups' directories, as the kernel shows it. */
function limitFile(join: string[], files: string[]): string | undefined {
  for (const dir of dirsOf(join)) {
    for (const file of files) {
      const full = path.join(dir, file);
      if (existsSync(full)) return readFileSync(full, 'utf8').trim();
    }
  }
  return undefined;
}

/** Empties the groups (their processes killed by pid, as another process would) and removes them, without killGroup. */
async function removeBehindTheBack(join: string[]): Promise<void> {
  for (const file of join) {
    const pids = () => readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number);
    for (const pid of pids()) process.kill(pid, 'SIGKILL');
    await waitFor('the group to empty', async () => pids().length === 0);
  }
  for (const dir of dirsOf(join)) rmdirSync(dir);
}

const marker = () => ({ hostId: uniqueId('cg-host'), sandboxId: uniqueId('cg-sbx') });

it('every start finds the groups there with the limits last asked for, whatever removed them in between', async () => {
  const limits = fc.record({ processes: fc.constantFrom(64, 4096), cpus: fc.constantFrom(1, 2) });
  const step = fc.oneof(
    limits.map((l) => ({ kind: 'prepare' as const, limits: resolveLimits(l) })),
    fc.constant({ kind: 'remove' as const }),
    fc.constant({ kind: 'kill' as const }),
    fc.constant({ kind: 'tamper' as const }),
  );
  await fc.assert(
    fc.asyncProperty(fc.array(step, { minLength: 1, maxLength: 8 }), async (steps) => {
      const m = marker();
      let join: string[] = [];
      try {
        for (const s of steps) {
          if (s.kind === 'remove') {
            if (dirsOf(join).every((dir) => existsSync(dir))) await removeBehindTheBack(join);
            continue;
          }
          if (s.kind === 'tamper') {
            // What the sandbox itself could do to its own groups between two starts.
            for (const dir of dirsOf(join)) {
              const file = path.join(dir, 'pids.max');
              if (existsSync(file)) writeFileSync(file, 'max');
            }
            continue;
          }
          if (s.kind === 'kill') {
            await killGroup(m, 5_000);
            continue;
          }
          const prepared = prepareGroups(m, s.limits);
          join = prepared.join;
          expect(join.length).toBeGreaterThan(0); // a host without any cgroup cannot run this test
          for (const dir of dirsOf(join)) expect(existsSync(dir)).toBe(true);
          if (prepared.enforced.has('processes'))
            expect(limitFile(join, ['pids.max'])).toBe(String(s.limits.processes));
          if (prepared.enforced.has('cpus')) {
            const quota = String(Math.round(s.limits.cpus * 100_000));
            expect(limitFile(join, ['cpu.max', 'cpu.cfs_quota_us'])?.split(' ')[0]).toBe(quota);
          }
        }
      } finally {
        await killGroup(m, 5_000);
      }
    }),
    { numRuns: 40 },
  );
});

it('a sandbox whose groups were removed behind the worker’s back still starts its commands tracked and killed with it', async () => {
  const host = await makeHost();
  const sandboxId = await host.sandbox();
  const limits: ResolvedLimits = resolveLimits(undefined);
  // The groups the sandbox's init joined: the worker's prepared ones, as the next start would find them.
  const { join } = prepareGroups({ hostId: host.hostId, sandboxId }, limits);
  await removeBehindTheBack(join);
  expect(await host.provider.processCount(sandboxId)).toBe(0);
  // A detached process that would outlive its exec if it were not in the sandbox's groups.
  expect(await sh(host.provider, sandboxId, 'setsid nohup sleep 60 >/dev/null 2>&1 & echo started')).toBe('started\n');
  expect(await host.provider.processCount(sandboxId)).toBeGreaterThan(0);
  await host.provider.release(
    { sandboxId, idempotencyKey: uniqueId('rel'), mode: 'TERMINATE', fence: 2, reason: 'test' },
    context(),
  );
  expect(await host.provider.processCount(sandboxId)).toBe(0);
});

it('a kill removes the v1 groups even while their last process is still exiting (rmdir refuses them until then)', async () => {
  const m = marker();
  const { join } = prepareGroups(m, resolveLimits(undefined));
  // Joined to the v1 groups alone, as on a host without v2 tracking, where the kill goes by pid.
  const v2 = hierarchies().v2;
  const v1 = join.filter((file) => v2 === undefined || !file.startsWith(`${v2}/`));
  expect(v1.length).toBeGreaterThan(0); // a host without v1 groups cannot run this test
  // A process whose exit takes a while: 256 MiB of its own pages to give back.
  const child = spawn(
    'python3',
    ['-c', "b = b'x' * (256 << 20); print('ready', flush=True); import time; time.sleep(60)"],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  try {
    for (const file of v1) writeFileSync(file, String(child.pid));
    await new Promise<void>((resolve) => child.stdout!.once('data', () => resolve()));
    process.kill(child.pid!, 'SIGKILL');
    await killGroup(m, 5_000);
    // Its host's groups too, which held no other sandbox's.
    for (const dir of dirsOf(join)) expect([existsSync(dir), existsSync(path.dirname(dir))]).toEqual([false, false]);
  } finally {
    child.kill('SIGKILL');
  }
});

it('a kill leaves the groups of the host’s other sandboxes, which still start; the host’s group goes with its last', async () => {
  const hostId = uniqueId('cg-host');
  const sandboxes = [uniqueId('cg-a'), uniqueId('cg-b')].map((sandboxId) => ({ hostId, sandboxId }));
  const limits = resolveLimits(undefined);
  const [a, b] = sandboxes.map((m) => dirsOf(prepareGroups(m, limits).join));
  await killGroup(sandboxes[0], 5_000);
  expect(a.map((dir) => existsSync(dir))).toEqual(a.map(() => false));
  expect(b.map((dir) => existsSync(dir))).toEqual(b.map(() => true));
  expect(dirsOf(prepareGroups(sandboxes[0], limits).join)).toEqual(a);
  for (const m of sandboxes) await killGroup(m, 5_000);
  for (const dir of [...a, ...b]) expect([existsSync(dir), existsSync(path.dirname(dir))]).toEqual([false, false]);
});
