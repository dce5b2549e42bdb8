import { readdirSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { removeTree } from '../../providers/files';
import { nest } from '../helpers/deep-tree';
import { tempDir } from './helpers';

// A sandbox can nest directories far deeper than any path allows (`mkdir a; cd a` in a loop: 21,000
// levels in about a second). Removing its tree (destroy, a restore's swapped-out tree) held one
// descriptor per level, which ran the worker out of descriptors: every other open in the worker failed
// meanwhile, and the removal itself failed with EMFILE on every retry.

const openDescriptors = () => readdirSync('/proc/self/fd').length;

it('a tree nested thousands of levels deep is removed whole, holding a bounded number of descriptors', async () => {
  const parent = await tempDir('remove-deep');
  const root = path.join(parent, 'sandbox');
  await fs.mkdir(root);
  nest(root, 3000);
  const before = openDescriptors();
  let most = before;
  const sampler = setInterval(() => (most = Math.max(most, openDescriptors())), 1);
  try {
    await removeTree(root);
  } finally {
    clearInterval(sampler);
  }
  expect(await fs.readdir(parent)).toEqual([]);
  // 64 levels held open at most, each with a child being looked at: far from one per level.
  expect(most - before).toBeLessThan(300);
});
