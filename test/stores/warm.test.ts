import fc from 'fast-check';
import * as fsSync from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { warmMetadata, warmTrees } from '../../stores/warm';
import { tempDir } from '../providers/helpers';
import { listNoFollow } from './cas-helpers';

// The metadata warm-up runs ahead of a checkpoint's walk over a sandbox's files: it must look at
// exactly what the walk may look at (below the top names, no link followed, however the sandbox
// links its directories to the host's) and stop when told.

const NAMES = ['workspace', 'home'];

test('looks up every entry below the top names and none through a link, in the thread as in place', async () => {
  const step = fc.record({
    kind: fc.constantFrom('dir', 'file', 'link-out', 'link-in'),
    at: fc.nat(),
  });
  await fc.assert(
    fc.asyncProperty(fc.array(step, { maxLength: 25 }), async (steps) => {
      const root = await tempDir('warm-src');
      // A host directory with entries the warm-up must never reach.
      const outside = await tempDir('warm-outside');
      for (let i = 0; i < 30; i += 1) await fs.writeFile(path.join(outside, `secret${i}`), 'x');
      const dirs = NAMES.map((name) => path.join(root, name));
      for (const dir of dirs) await fs.mkdir(dir);
      for (const [n, s] of steps.entries()) {
        const parent = dirs[s.at % dirs.length];
        const made = path.join(parent, `e${n}`);
        if (s.kind === 'dir') {
          await fs.mkdir(made);
          dirs.push(made);
        }
        if (s.kind === 'file') await fs.writeFile(made, 'y');
        if (s.kind === 'link-out') await fs.symlink(outside, made);
        if (s.kind === 'link-in') await fs.symlink(dirs[0], made);
      }
      let expected = 0;
      for (const name of NAMES) expected += (await listNoFollow(path.join(root, name))).length;
      const stop = new Int32Array(new SharedArrayBuffer(4));
      expect(warmTrees(fsSync, root, [...NAMES, 'missing'], stop, 0)).toBe(expected);
      expect(await warmMetadata(root, NAMES, 0).looked).toBe(expected);
      // Every lookup taken as cached: each directory is still listed and entered, and only two of its other names looked up.
      let cached = 0;
      for (const name of NAMES) {
        const listed = await listNoFollow(path.join(root, name));
        const dirs = ['', ...listed.filter((p) => fsSync.lstatSync(path.join(root, name, p)).isDirectory())];
        cached += dirs.length - 1;
        for (const dir of dirs) {
          const others = listed.filter((p) => path.dirname(p) === (dir || '.') && !dirs.includes(p));
          cached += Math.min(2, others.length);
        }
      }
      expect(warmTrees(fsSync, root, NAMES, stop, Infinity)).toBe(cached);
      await fs.rm(root, { recursive: true, force: true });
      await fs.rm(outside, { recursive: true, force: true });
    }),
    { numRuns: 20 },
  );
});

test('a top name that is a link (an active workspace) is followed; told to stop, it looks up nothing more', async () => {
  const root = await tempDir('warm-top');
  const host = await tempDir('warm-host');
  for (let i = 0; i < 10; i += 1) await fs.writeFile(path.join(host, `f${i}`), 'z');
  await fs.symlink(host, path.join(root, 'workspace'));
  const stop = new Int32Array(new SharedArrayBuffer(4));
  expect(warmTrees(fsSync, root, ['workspace'], stop, 0)).toBe(10);
  Atomics.store(stop, 0, 1);
  expect(warmTrees(fsSync, root, ['workspace'], stop, 0)).toBe(0);
  const stopped = warmMetadata(root, ['workspace']);
  stopped.stop();
  // Stopped before or while it ran: never more than the tree.
  expect(await stopped.looked).toBeLessThanOrEqual(10);
});

test('a directory whose name is not UTF-8 is warmed by its bytes (as a string it opened nothing)', async () => {
  const root = await tempDir('warm-raw');
  const dir = Buffer.concat([Buffer.from(`${root}/workspace/`), Buffer.from([0xff])]);
  fsSync.mkdirSync(path.join(root, 'workspace'));
  fsSync.mkdirSync(dir);
  for (let i = 0; i < 10; i += 1) fsSync.writeFileSync(Buffer.concat([dir, Buffer.from(`/f${i}`)]), 'x');
  // cachedNs 0: every name is looked up, the directory and its 10 files.
  expect(warmTrees(fsSync, root, ['workspace'], new Int32Array(new SharedArrayBuffer(4)), 0)).toBe(11);
});
