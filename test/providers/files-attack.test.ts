import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { readWorkspaceFile, removeTree, writeWorkspaceFile } from '../../providers/files';
import { swapLoop, swapping, tempDir } from './helpers';

// Attacks on the worker's file access that a hostile sandbox or caller can
// mount beyond a single racing read or write: a path deep enough to exhaust the
// worker's descriptors, and a process that outlived its sandbox's kill swapping
// a directory for a link to a host directory while the sandbox is removed.

/** Runs `body` with this process's soft descriptor limit lowered to `limit`. */
async function withDescriptorLimit<T>(limit: number, body: () => Promise<T>): Promise<T> {
  const pid = String(process.pid);
  const [soft] = execFileSync('prlimit', ['--pid', pid, '--nofile', '--noheadings', '--output=SOFT', '--raw'])
    .toString()
    .trim()
    .split(/\s+/);
  execFileSync('prlimit', ['--pid', pid, `--nofile=${limit}:`]);
  try {
    return await body();
  } finally {
    execFileSync('prlimit', ['--pid', pid, `--nofile=${soft}:`]);
  }
}

test('a path of 2,000 names does not hold 2,000 descriptors of the worker', async () => {
  const workspace = await tempDir('deep');
  // The longest path a caller may send (4,096 characters): 2,048 names.
  const deep = Array.from({ length: 2000 }, () => 'a').join('/');
  const content = Buffer.from('deep');
  await withDescriptorLimit(512, async () => {
    await writeWorkspaceFile(workspace, deep, content);
    expect(await readWorkspaceFile(workspace, deep)).toEqual(content);
  });
  await fs.rm(workspace, { recursive: true, force: true });
});

test('removing a sandbox never deletes through a directory swapped for a link to the host', async () => {
  const base = await tempDir('remove-race');
  const victim = path.join(base, 'host');
  await fs.mkdir(victim);
  const hostFiles = Array.from({ length: 50 }, (_, i) => `f${i}`);
  for (const name of hostFiles) await fs.writeFile(path.join(victim, name), 'host');
  const trials = 30;
  for (let trial = 0; trial < trials; trial++) {
    const root = path.join(base, `sandbox-${trial}`);
    const workspace = path.join(root, 'workspace');
    await fs.mkdir(workspace, { recursive: true });
    // The directory the swap exchanges with the link holds as many names as the host directory does.
    await fs.mkdir(path.join(workspace, 'd'));
    for (const name of hostFiles) await fs.writeFile(path.join(workspace, 'd', name), 'sandbox');
    const [command, ...args] = swapLoop('d', victim);
    const swapper = spawn(command, args, { cwd: workspace, stdio: 'ignore' });
    try {
      await swapping(path.join(workspace, 'd'));
      await removeTree(root).catch(() => undefined); // may give up on a tree that keeps changing; never reach outside
    } finally {
      swapper.kill('SIGKILL');
    }
    await fs.rm(root, { recursive: true, force: true }).catch(() => undefined);
  }
  expect((await fs.readdir(victim)).sort()).toEqual([...hostFiles].sort());
});

test('removeTree removes a tree whole, links as links, and the root when it is a link', async () => {
  const base = await tempDir('remove');
  const outside = path.join(base, 'outside');
  await fs.mkdir(outside);
  await fs.writeFile(path.join(outside, 'keep'), 'x');
  const root = path.join(base, 'root');
  await fs.mkdir(path.join(root, 'a', 'b'), { recursive: true });
  await fs.writeFile(path.join(root, 'a', 'b', 'f'), 'y');
  await fs.symlink(outside, path.join(root, 'a', 'out'));
  await fs.symlink(outside, path.join(root, 'workspace'));
  execFileSync('mkfifo', [path.join(root, 'a', 'fifo')]);
  await removeTree(root);
  await expect(fs.lstat(root)).rejects.toMatchObject({ code: 'ENOENT' });
  expect(await fs.readdir(outside)).toEqual(['keep']);
  const link = path.join(base, 'link');
  await fs.symlink(outside, link);
  await removeTree(link);
  await expect(fs.lstat(link)).rejects.toMatchObject({ code: 'ENOENT' });
  expect(await fs.readdir(outside)).toEqual(['keep']);
  await removeTree(path.join(base, 'missing'));
  await fs.rm(base, { recursive: true, force: true });
});
