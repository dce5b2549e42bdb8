import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import fc from 'fast-check';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, s3StoreFromEnv } from './helpers';
import { makeHost, sh, snapshotAndTerminate } from './harness';

// A sandbox's files may be dated before 1970 (`touch -d 1969-12-31`, an archive extracted with its old
// dates): their mtimes are negative. The release wrote them into the manifest, restore refused the
// manifest (CHECKPOINT_INVALID), and the release had already terminated compute: the sandbox's files
// were only in this host's local copy. And Node sets a negative time as "now". Each time a sandbox makes
// must come back on another host, from the store, to the microsecond a checkpoint keeps.

/** Seconds and nanoseconds since 1970 that the test's filesystem holds (ext4: 1901-2038 at least). */
const when = fc.record({
  seconds: fc.oneof(
    fc.integer({ min: -(2 ** 31) + 1, max: 2 ** 31 - 2 }),
    fc.integer({ min: -3, max: 2 }),
    fc.constantFrom(-(2 ** 31) + 1, -86_400, 2 ** 31 - 2),
  ),
  nanos: fc.oneof(fc.integer({ min: 0, max: 999_999_999 }), fc.constantFrom(0, 999, 1000, 500_000, 999_999_000)),
});

/** `touch -d @…` of an instant given as whole seconds (rounded down) and the nanoseconds past them. */
function epoch({ seconds, nanos }: { seconds: number; nanos: number }): string {
  // `@-1.25` means 1.25 s before 1970: the nanoseconds count back from the whole second when it is negative.
  const ns = BigInt(seconds) * 1_000_000_000n + BigInt(nanos);
  const sign = ns < 0n ? '-' : '';
  const abs = ns < 0n ? -ns : ns;
  return `@${sign}${abs / 1_000_000_000n}.${(abs % 1_000_000_000n).toString().padStart(9, '0')}`;
}

it('files, directories and symlinks dated before 1970 are restored on another host from the store, to the microsecond', async () => {
  const times = fc.sample(when, { numRuns: 120, seed: 20261207 });
  // A file, a directory and a symlink for each instant, dated by the sandbox's own touch.
  const script = times
    .map((t, i) => {
      const at = epoch(t);
      return `echo ${i} > f${i} && touch -d '${at}' f${i} && mkdir d${i} && ln -s f${i} l${i} && touch -h -d '${at}' l${i}`;
    })
    // Directories last: making the links and files inside would move their mtimes.
    .concat(times.map((t, i) => `touch -d '${epoch(t)}' d${i}`))
    .join(' && ');
  const store = s3StoreFromEnv();
  const hostA = await makeHost({ store });
  const hostB = await makeHost({ store });
  const id = await hostA.sandbox();
  await sh(hostA.provider, id, script);
  const workspaceA = sandboxPaths(hostA.dataDir, id).workspace;
  const made = await fs.lstat(path.join(workspaceA, 'f0'), { bigint: true });
  const first = BigInt(times[0].seconds) * 1_000_000_000n + BigInt(times[0].nanos);
  expect(made.mtimeNs).toBe(first);
  expect(times.filter((t) => t.seconds < 0).length).toBeGreaterThan(30);

  const receipt = await snapshotAndTerminate(hostA.provider, id, 2);
  expect(await hostA.provider.processCount(id)).toBe(0);
  if (!receipt.checkpoint) throw new Error('no checkpoint');
  const restored = await hostB.provider.restore({ sandboxId: id, fence: 3, checkpoint: receipt.checkpoint }, context());
  expect(restored.source).toBe('checkpoint');

  const workspaceB = sandboxPaths(hostB.dataDir, id).workspace;
  const wrong: string[] = [];
  for (let i = 0; i < times.length; i++) {
    for (const name of [`f${i}`, `d${i}`, `l${i}`]) {
      const [a, b] = await Promise.all([
        fs.lstat(path.join(workspaceA, name), { bigint: true }),
        fs.lstat(path.join(workspaceB, name), { bigint: true }),
      ]);
      // A checkpoint keeps the microsecond (toward zero, as it is written down); the host read it back exact.
      if ((a.mtimeNs / 1000n) * 1000n !== b.mtimeNs)
        wrong.push(`${name} (${epoch(times[i])}): ${a.mtimeNs} → ${b.mtimeNs}`);
    }
  }
  expect(wrong).toEqual([]);
  expect(await fs.readFile(path.join(workspaceB, 'f7'), 'utf8')).toBe('7\n');
}, 180_000);
