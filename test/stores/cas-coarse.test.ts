import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { NAMES, restoreFresh, take } from './cas-helpers';

// Change detection on a filesystem that keeps whole seconds (ext4 with 128-byte inodes, as some hosts
// and network filesystems give): a file rewritten in the second its stat was taken keeps its size,
// mtime, ctime and inode. The racy rule must then distrust a whole second, not 50 ms, or the next
// suspend keeps the old chunks and the change is lost. Real loop-mounted ext4 (root and loop devices,
// as CI has), real MinIO.

const store = s3StoreFromEnv(5 * 1024 * 1024);
let image: string;
let mountPoint: string;

beforeAll(async () => {
  const dir = await tempDir('cas-coarse');
  image = path.join(dir, 'fs.img');
  mountPoint = path.join(dir, 'mnt');
  await fs.mkdir(mountPoint);
  execFileSync('truncate', ['-s', '32M', image]);
  execFileSync('mkfs.ext4', ['-q', '-F', '-I', '128', image]);
  execFileSync('mount', ['-o', 'loop', image, mountPoint]);
});

afterAll(async () => {
  execFileSync('umount', [mountPoint]);
  await fs.rm(path.dirname(image), { recursive: true, force: true });
});

async function sandboxRoot(): Promise<string> {
  const root = path.join(mountPoint, uniqueId('root'));
  for (const name of NAMES) await fs.mkdir(path.join(root, name), { recursive: true });
  return root;
}

/** Waits until the wall clock is `ms` into a second. */
async function intoSecond(ms: number): Promise<void> {
  const into = Date.now() % 1000;
  await delay((ms - into + 1000) % 1000);
}

/** The file's ctime, ns. */
async function ctimeOf(file: string): Promise<bigint> {
  return (await fs.stat(file, { bigint: true })).ctimeNs;
}

/**
 * Runs `attempt` until it reports that its rewrite fell in the very second of the baseline's stat (the
 * case under test); a slow machine crossing a second boundary is tried again.
 */
async function inOneSecond(attempt: () => Promise<boolean>): Promise<void> {
  for (let tries = 0; tries < 8; tries += 1) if (await attempt()) return;
  throw new Error('never managed a rewrite in the second of the baseline (machine too slow?)');
}

test('the filesystem under test keeps whole seconds', async () => {
  const file = path.join(await sandboxRoot(), 'workspace', 'probe');
  for (let i = 0; i < 3; i += 1) {
    await fs.writeFile(file, `probe ${i}`);
    const stat = await fs.stat(file, { bigint: true });
    expect(stat.ctimeNs % 1_000_000_000n).toBe(0n);
    expect(stat.mtimeNs % 1_000_000_000n).toBe(0n);
    await delay(137);
  }
});

test('a same-size rewrite in the second a suspend walked the file is uploaded by the next suspend', async () => {
  await inOneSecond(async () => {
    const root = await sandboxRoot();
    const sandboxId = uniqueId('coarse-walk');
    const file = path.join(root, 'workspace', 'notes.txt');
    await intoSecond(5);
    await fs.writeFile(file, 'first version\n');
    const written = await ctimeOf(file);
    // Past the 50 ms a filesystem keeping nanoseconds is distrusted for, still in the same second.
    await delay(80);
    const first = await take(store, root, sandboxId);
    await fs.writeFile(file, 'other version\n');
    if ((await ctimeOf(file)) !== written || BigInt(first.baseline.takenAtNs) < written + 60_000_000n) return false;
    const second = await take(store, root, sandboxId, first.baseline);
    const { target } = await restoreFresh(store, second.checkpoint);
    expect(await fs.readFile(path.join(target, 'workspace', 'notes.txt'), 'utf8')).toBe('other version\n');
    await store.deletePrefix(`checkpoints/${sandboxId}/`);
    return true;
  });
});

test('a same-size rewrite in the second a restore wrote the file is uploaded by the next suspend', async () => {
  const source = await sandboxRoot();
  const sandboxId = uniqueId('coarse-restore');
  await fs.writeFile(path.join(source, 'workspace', 'notes.txt'), 'first version\n');
  const taken = await take(store, source, sandboxId);
  await inOneSecond(async () => {
    const target = path.join(mountPoint, uniqueId('restored'));
    await intoSecond(5);
    const { baseline } = await restoreFresh(store, taken.checkpoint, target);
    const file = path.join(target, 'workspace', 'notes.txt');
    const restored = await ctimeOf(file);
    // Past the 50 ms window when the rewrite comes: only the coarse rule can tell.
    const past = restored + 60_000_000n;
    while (BigInt(Date.now()) * 1_000_000n < past) await delay(5);
    // Its mtime put back, as `cp -p`, `rsync -a` or `tar -x` do: only the ctime could tell.
    const { mtime } = await fs.stat(file);
    await fs.writeFile(file, 'other version\n');
    await fs.utimes(file, mtime, mtime);
    if ((await ctimeOf(file)) !== restored) return false;
    const next = await take(store, target, sandboxId, baseline);
    const again = await restoreFresh(store, next.checkpoint);
    expect(await fs.readFile(path.join(again.target, 'workspace', 'notes.txt'), 'utf8')).toBe('other version\n');
    return true;
  });
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});
