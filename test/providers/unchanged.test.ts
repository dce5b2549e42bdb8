import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import fc from 'fast-check';
import type { Checkpoint } from '../../common/schemas';
import { withLifecycleLock } from '../../providers/maintenance';
import { killSandbox } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { checkpointPrefix } from '../../providers/snapshot';
import { mountVolume, unmountVolume } from '../../providers/volume';
import { collectGarbage } from '../../stores/cas/gc';
import { context, manifest } from './helpers';
import { sh, type Host } from './harness';
import { snapshot, volumeHost } from './volume-hosts';

// An unchanged re-suspend repeats the last checkpoint without a walk when the volume's write count
// (ext4's lifetime_write_kbytes) is what it was at the resume (snapshot.ts, recordUnchanged). A false
// "unchanged" loses data, so these tests make every change a hostile sandbox can make between the
// resume and the release, and check the checkpoint in the store, restored on another host, against
// the files the first host kept. A repeated checkpoint is the very top object again (same sha256);
// a walked one is a new one (its time), so the tests see which way a release went.

/** The sandbox's trees as files (content, mode, mtime, links) and which paths share an inode. */
async function treeOf(volume: string): Promise<string[]> {
  const lines: string[] = [];
  for (const tree of ['workspace', 'home', 'envs']) {
    const root = path.join(volume, tree);
    lines.push(...(await manifest(root)).map((line) => `${tree}: ${line}`));
    const byInode = new Map<bigint, string[]>();
    for (const entry of await fs.readdir(root, { recursive: true })) {
      const stat = await fs.lstat(path.join(root, String(entry)), { bigint: true });
      if (stat.isFile() && stat.nlink > 1n) byInode.set(stat.ino, [...(byInode.get(stat.ino) ?? []), String(entry)]);
    }
    for (const names of byInode.values()) lines.push(`${tree}: linked ${names.sort().join(' ')}`);
  }
  return lines.sort();
}

/** The files a released sandbox left on `host` (its volume mounted for the look, then unmounted again). */
async function dormantTree(host: Host, id: string): Promise<string[]> {
  const paths = sandboxPaths(host.dataDir, id);
  // Under the sandbox's lock: behind what the release left for after its receipt (the unmount among it).
  return withLifecycleLock(id, async () => {
    await mountVolume(paths);
    try {
      return await treeOf(paths.volume);
    } finally {
      await unmountVolume(paths);
    }
  });
}

/** `checkpoint` restored from the store on `other`, as its files. */
async function restoredElsewhere(other: Host, id: string, checkpoint: Checkpoint, fence: number): Promise<string[]> {
  const restored = await other.provider.restore({ sandboxId: id, fence, checkpoint }, context());
  expect(restored.source).toBe('checkpoint');
  // Left running: the next restore there replaces it.
  return treeOf(sandboxPaths(other.dataDir, id).volume);
}

/** A fresh value each time (a change that writes what was there is no change). */
const FRESH = '$(date +%s%N)';

/** What a hostile sandbox may do between a resume and the next release (its workspace is the cwd). */
const CHANGES: Record<string, string> = {
  'content write in place': `printf %s ${FRESH} | dd of=a.txt bs=1 seek=1 conv=notrunc status=none`,
  append: `echo ${FRESH} >> a.txt`,
  truncate: 'truncate -s 1 a.txt',
  chmod: 'if [ -x b.txt ]; then chmod 644 b.txt; else chmod 755 b.txt; fi',
  rename: 'if [ -e c.txt ]; then mv c.txt c2.txt; else mv c2.txt c.txt; fi',
  unlink: `rm -f d/gone-*; echo ${FRESH} > d/next; rm d/next; touch d/gone-${FRESH}`,
  'mkdir and rmdir': `rmdir e/* 2>/dev/null; mkdir -p e/${FRESH}`,
  symlink: `ln -sfn target-${FRESH} l`,
  hardlink: 'ln -f a.txt h-$(date +%N)',
  'utimes back to the old mtime': `m=$(stat -c %y r.bin); printf %s ${FRESH} | dd of=r.bin bs=1 seek=5 conv=notrunc status=none; touch -d "$m" r.bin`,
  'home and envs': `echo ${FRESH} > ~/h.txt; echo ${FRESH} > ../envs/e.txt`,
  // Written through a shared mapping, never msynced; the writer is frozen holding it, then killed.
  'write through a shared mmap': `nohup python3 -c "
import mmap, time
f = open('r.bin', 'r+b'); m = mmap.mmap(f.fileno(), 0)
m[100:110] = b'%010d' % (time.time_ns() % 10**10)
time.sleep(600)" >/dev/null 2>&1 & sleep 0.5`,
  // Still writing when the release freezes the sandbox.
  // (Once it has written: a loop frozen before its first write changed nothing, and a repeat would be right.)
  'just before the freeze': `nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > busy.txt; done' >/dev/null 2>&1 &
while [ ! -e busy.txt ]; do sleep 0.01; done`,
};

const SETUP = [
  'echo first > a.txt; echo b > b.txt; echo c > c.txt; mkdir -p d e ~ ../envs',
  'head -c 300000 /dev/urandom > r.bin; ln -s target l; echo home > ~/h.txt; echo env > ../envs/e.txt',
].join('; ');

test('every change a hostile sandbox makes after a resume is in the next checkpoint, restored elsewhere; an unchanged one repeats its checkpoint', async () => {
  const host = await volumeHost();
  const other = await volumeHost(host.store);
  const id = await host.sandbox();
  await sh(host.provider, id, SETUP);
  let fence = 2;
  let checkpoint = (await host.provider.release(snapshot(id, fence), context())).checkpoint!;
  let tree = await dormantTree(host, id);
  const names = Object.keys(CHANGES);
  const seen = { repeated: 0, walked: 0 };
  await fc.assert(
    fc.asyncProperty(fc.array(fc.constantFrom(...names), { maxLength: 3 }), async (changes) => {
      fence += 1;
      expect((await host.provider.restore({ sandboxId: id, fence, checkpoint }, context())).source).toBe('local-copy');
      for (const change of changes) await sh(host.provider, id, CHANGES[change], fence);
      fence += 1;
      const next = (await host.provider.release(snapshot(id, fence), context())).checkpoint!;
      const now = await dormantTree(host, id);
      // Repeated only when nothing changed; and what the first host kept is what the store holds.
      if (next.sha256 === checkpoint.sha256) {
        seen.repeated += 1;
        expect(now).toEqual(tree);
      } else seen.walked += 1;
      if (changes.length === 0) expect(next.sha256).toBe(checkpoint.sha256);
      fence += 1;
      expect(await restoredElsewhere(other, id, next, fence)).toEqual(now);
      checkpoint = next;
      tree = now;
    }),
    { numRuns: 25, endOnFailure: true },
  );
  // Every change moves the count (each one changes a file), so a repeat comes from an empty list alone.
  expect(seen.walked).toBeGreaterThan(0);
}, 600_000);

test.each([
  ...Object.entries(CHANGES),
  ['an xattr', `python3 -c "import os; os.setxattr('a.txt', 'user.stasis', b'x')"`],
  ['a write and its undo', 'cp a.txt a.bak; echo x >> a.txt; mv a.bak a.txt'],
])(
  '%s after a resume takes the walk',
  async (_name, command) => {
    const host = await volumeHost();
    const id = await host.sandbox();
    await sh(host.provider, id, SETUP);
    const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
    await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
    await sh(host.provider, id, command, 3);
    const second = (await host.provider.release(snapshot(id, 4), context())).checkpoint!;
    expect(second.sha256).not.toBe(first.sha256);
  },
  120_000,
);

test('a remount between the resume and the release takes the walk', async () => {
  const host = await volumeHost();
  const id = await host.sandbox();
  await sh(host.provider, id, SETUP);
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
  // The processes end (a busy volume would only be detached), the volume is mounted anew, nothing written.
  const paths = sandboxPaths(host.dataDir, id);
  await killSandbox({ hostId: host.hostId, sandboxId: id });
  await unmountVolume(paths);
  await mountVolume(paths);
  const second = (await host.provider.release(snapshot(id, 4), context())).checkpoint!;
  expect(second.sha256).not.toBe(first.sha256);
}, 120_000);

test('a repeated checkpoint restores byte for byte after the one it repeats is deleted and garbage is collected', async () => {
  const host = await volumeHost();
  const other = await volumeHost(host.store);
  const id = await host.sandbox();
  await sh(
    host.provider,
    id,
    `${SETUP}; head -c 5000000 /dev/urandom > big.bin; seq 1 200 | xargs -I{} sh -c 'echo {} > s{}'`,
  );
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  const tree = await dormantTree(host, id);
  await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
  const second = (await host.provider.release(snapshot(id, 4), context())).checkpoint!;
  expect(second.sha256).toBe(first.sha256);
  expect(second.uri).not.toBe(first.uri);
  await host.store.delete(first.uri);
  await collectGarbage(host.store, checkpointPrefix(id), { graceMs: 0 });
  expect(await restoredElsewhere(other, id, second, 5)).toEqual(tree);
  // And again from the repeated one: its baseline is the repeated checkpoint's.
  await host.provider.restore({ sandboxId: id, fence: 6, checkpoint: second }, context());
  const third = (await host.provider.release(snapshot(id, 7), context())).checkpoint!;
  expect(third.sha256).toBe(first.sha256);
  await host.store.delete(second.uri);
  await collectGarbage(host.store, checkpointPrefix(id), { graceMs: 0 });
  expect(await restoredElsewhere(other, id, third, 8)).toEqual(tree);
}, 120_000);

test('an active workspace (on the host’s disk, which the count does not see) always takes the walk', async () => {
  const host = await volumeHost();
  const hostPath = path.join(host.dataDir, 'active-workspace');
  const id = await host.sandbox({ hostPath });
  await sh(host.provider, id, SETUP);
  const first = (await host.provider.release(snapshot(id, 2), context())).checkpoint!;
  await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first }, context());
  const second = (await host.provider.release(snapshot(id, 4), context())).checkpoint!;
  expect(second.sha256).not.toBe(first.sha256);
}, 120_000);
