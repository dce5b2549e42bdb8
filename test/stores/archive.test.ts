import { createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { gzipSync } from 'node:zlib';
import { Header, type HeaderData } from 'tar';
import { packSandbox, unpackCheckpoint } from '../../stores/archive';
import { listTree, manifest, stasisError, tempDir } from '../providers/helpers';

// Checkpoint archives: a faithful round trip, and hostile archives refused
// before anything is written.

interface Crafted extends HeaderData {
  data?: Buffer;
}

/** A tar.gz built header by header with node-tar's Header, so it can say anything. */
function craft(entries: Crafted[]): Buffer {
  const blocks: Buffer[] = [];
  for (const { data = Buffer.alloc(0), ...fields } of entries) {
    const block = Buffer.alloc(512);
    new Header({
      mode: 0o644,
      uid: 0,
      gid: 0,
      mtime: new Date('2024-01-01T00:00:00Z'),
      size: data.length,
      ...fields,
    }).encode(block, 0);
    blocks.push(block, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return gzipSync(Buffer.concat(blocks));
}

const dir = (p: string): Crafted => ({ path: p, type: 'Directory', mode: 0o755 });
const file = (p: string, content = 'x'): Crafted => ({ path: p, type: 'File', data: Buffer.from(content) });

describe('packSandbox / unpackCheckpoint', () => {
  it('keeps a file’s mtime second even in its last half-millisecond (Node rounds stat.mtime to the nearest ms)', async () => {
    const root = await tempDir('pack-mtime');
    await fs.mkdir(path.join(root, 'workspace'));
    const file = path.join(root, 'workspace', 'edge');
    await fs.writeFile(file, 'x');
    await fs.utimes(file, 1796103688.9996, 1796103688.9996);
    expect(Math.floor((await fs.stat(file)).mtimeMs / 1000)).toBe(1796103688);
    const archive = path.join(await tempDir('archive'), 'c.tar.gz');
    await pipeline(packSandbox(root, ['workspace']), createWriteStream(archive));
    const target = await tempDir('unpack');
    await unpackCheckpoint(archive, target);
    expect(Math.floor((await fs.stat(path.join(target, 'workspace', 'edge'))).mtimeMs / 1000)).toBe(1796103688);
  });

  it('round-trips files, modes, mtimes, empty dirs, symlinks (anywhere) and hardlinks, following only a top-level link', async () => {
    const root = await tempDir('pack');
    const hostWorkspace = await tempDir('host-ws');
    await fs.symlink(hostWorkspace, path.join(root, 'workspace')); // an active workspace
    await fs.mkdir(path.join(root, 'home', '.cache', 'empty'), { recursive: true });
    await fs.mkdir(path.join(root, 'envs'));
    await fs.mkdir(path.join(hostWorkspace, 'src', 'deep', 'empty'), { recursive: true });
    await fs.writeFile(path.join(hostWorkspace, 'src', 'main.sh'), '#!/bin/sh\necho hi\n', { mode: 0o755 });
    await fs.writeFile(path.join(hostWorkspace, 'secret'), 'token', { mode: 0o600 });
    await fs.utimes(
      path.join(hostWorkspace, 'secret'),
      new Date('2020-02-02T00:00:00Z'),
      new Date('2020-02-02T00:00:00Z'),
    );
    await fs.symlink('src/main.sh', path.join(hostWorkspace, 'run'));
    await fs.symlink('src', path.join(hostWorkspace, 'code'));
    await fs.symlink('../home/.cache', path.join(hostWorkspace, 'cache'));
    // Links out of the checkpoint, as a venv has them: recreated verbatim, never followed.
    await fs.symlink('/usr/bin/python3', path.join(hostWorkspace, 'python'));
    await fs.symlink('../../../../outside/of/everything', path.join(hostWorkspace, 'climbing'));
    await fs.symlink('/nonexistent/dangling', path.join(hostWorkspace, 'dangling'));
    await fs.link(path.join(hostWorkspace, 'secret'), path.join(hostWorkspace, 'secret-hardlink'));
    await fs.writeFile(path.join(root, 'home', '.profile'), 'export A=1\n', { mode: 0o640 });
    await fs.writeFile(path.join(root, 'not-in-checkpoint'), 'meta');

    const archive = path.join(await tempDir('archive'), 'c.tar.gz');
    await pipeline(packSandbox(root, ['workspace', 'home', 'envs']), createWriteStream(archive));
    const target = await tempDir('unpack');
    await unpackCheckpoint(archive, target);

    expect(await listTree(target)).not.toContain('not-in-checkpoint');
    expect((await fs.lstat(path.join(target, 'workspace'))).isDirectory()).toBe(true);
    expect(await manifest(path.join(target, 'workspace'))).toEqual(await manifest(hostWorkspace));
    expect(await manifest(path.join(target, 'home'))).toEqual(await manifest(path.join(root, 'home')));
    expect(await fs.readdir(path.join(target, 'envs'))).toEqual([]);
    const [a, b] = await Promise.all(
      ['secret', 'secret-hardlink'].map((n) => fs.stat(path.join(target, 'workspace', n))),
    );
    expect(a.ino).toBe(b.ino);
  });

  it('keeps a sparse file’s holes: it takes about the disk it took, not its size (a byte every MiB, ending in a hole)', async () => {
    const root = await tempDir('pack-sparse');
    await fs.mkdir(path.join(root, 'workspace'));
    const sparse = path.join(root, 'workspace', 'sparse');
    const handle = await fs.open(sparse, 'wx');
    for (let i = 0; i < 64; i++) await handle.write(Buffer.from([i + 1]), 0, 1, i * 1024 * 1024 + i);
    await handle.truncate(70 * 1024 * 1024);
    await handle.close();
    const archive = path.join(await tempDir('archive'), 'c.tar.gz');
    await pipeline(packSandbox(root, ['workspace']), createWriteStream(archive));
    const target = await tempDir('unpack');
    await unpackCheckpoint(archive, target);
    const restored = path.join(target, 'workspace', 'sparse');
    expect(await manifest(path.join(target, 'workspace'))).toEqual(await manifest(path.join(root, 'workspace')));
    expect((await fs.stat(restored)).size).toBe(70 * 1024 * 1024);
    // 64 blocks of data (4 KiB each) and a few of the filesystem's own, not 70 MiB.
    expect((await fs.stat(restored)).blocks * 512).toBeLessThanOrEqual((await fs.stat(sparse)).blocks * 512 + 8192);
  });

  describe('refuses hostile archives before writing anything', () => {
    const cases: {
      name: string;
      entries: Crafted[];
      message: RegExp;
      limits?: { maxBytes: number; maxEntries: number };
    }[] = [
      {
        name: 'an absolute path',
        entries: [dir('workspace/'), file('/tmp/stasis-evil-abs')],
        message: /"\/tmp\/stasis-evil-abs" is an absolute path/,
      },
      {
        name: 'a .. segment',
        entries: [dir('workspace/'), file('workspace/../../evil')],
        message: /contains a "\.\." segment/,
      },
      {
        name: 'an entry outside the three dirs',
        entries: [dir('workspace/'), file('etc/passwd')],
        message: /is outside workspace\/, home\/, envs\//,
      },
      {
        name: 'a file written through a symlink',
        entries: [
          dir('workspace/'),
          { path: 'workspace/h', type: 'SymbolicLink', linkpath: '../home' },
          file('workspace/h/x'),
        ],
        message: /"workspace\/h\/x" would be written through the symlink workspace\/h/,
      },
      {
        name: 'a hardlink outside',
        entries: [dir('workspace/'), { path: 'workspace/hl', type: 'Link', linkpath: '/etc/shadow' }],
        message: /is a hardlink to "\/etc\/shadow", outside the archive/,
      },
      {
        name: 'a hardlink to something not in the archive',
        entries: [dir('workspace/'), { path: 'workspace/hl', type: 'Link', linkpath: 'workspace/missing' }],
        message: /is a hardlink to "workspace\/missing", which is not a regular file earlier in the archive/,
      },
      {
        name: 'a hardlink to a symlink',
        entries: [
          dir('workspace/'),
          { path: 'workspace/l', type: 'SymbolicLink', linkpath: '/etc/shadow' },
          { path: 'workspace/hl', type: 'Link', linkpath: 'workspace/l' },
        ],
        message: /is a hardlink to "workspace\/l", which is not a regular file earlier in the archive/,
      },
      {
        name: 'a file beneath a file',
        entries: [dir('workspace/'), file('workspace/f'), file('workspace/f/x')],
        message: /"workspace\/f\/x" lies beneath workspace\/f, which is not a directory/,
      },
      {
        name: 'a file beneath a symlink that comes later',
        entries: [
          dir('workspace/'),
          file('workspace/h/x'),
          { path: 'workspace/h', type: 'SymbolicLink', linkpath: '/etc' },
        ],
        message: /"workspace\/h\/x" would be written through the symlink workspace\/h/,
      },
      {
        name: 'a character device',
        entries: [dir('workspace/'), { path: 'workspace/null', type: 'CharacterDevice', devmaj: 1, devmin: 3 }],
        message: /is a character device/,
      },
      {
        name: 'a block device',
        entries: [dir('workspace/'), { path: 'workspace/sda', type: 'BlockDevice', devmaj: 8, devmin: 0 }],
        message: /is a block device/,
      },
      { name: 'a FIFO', entries: [dir('workspace/'), { path: 'workspace/fifo', type: 'FIFO' }], message: /is a FIFO/ },
      {
        name: 'a decompression bomb (bytes)',
        entries: [dir('workspace/'), { path: 'workspace/zeros', type: 'File', data: Buffer.alloc(4 * 1024 * 1024) }],
        limits: { maxBytes: 1024 * 1024, maxEntries: 100 },
        message: /takes the unpacked size past the limit of 1048576 bytes/,
      },
      {
        name: 'a decompression bomb (entries)',
        entries: [dir('workspace/'), ...Array.from({ length: 50 }, (_, i) => file(`workspace/f${i}`))],
        limits: { maxBytes: 1024 * 1024, maxEntries: 20 },
        message: /exceeds the limit of 20 entries per checkpoint/,
      },
      {
        name: 'a duplicate entry',
        entries: [dir('workspace/'), file('workspace/a'), file('workspace/a')],
        message: /appears twice/,
      },
    ];

    it.each(cases)('$name', async ({ entries, message, limits }) => {
      const base = await tempDir('hostile');
      const target = path.join(base, 'target');
      await fs.mkdir(target);
      await fs.mkdir(path.join(base, 'outside'));
      const archive = path.join(base, 'evil.tar.gz');
      // A harmless entry first: validation must refuse the whole archive, not stop half-way through extracting it.
      await fs.writeFile(archive, craft([dir('home/'), file('home/harmless'), ...entries]));
      const err = await stasisError(unpackCheckpoint(archive, target, limits), 'CHECKPOINT_INVALID');
      expect(err.message).toMatch(message);
      expect(await listTree(base)).toEqual(['evil.tar.gz', 'outside', 'target']);
      await expect(fs.access('/tmp/stasis-evil-abs')).rejects.toThrow();
    });

    it('refuses a file that is not a tar.gz, and a truncated one', async () => {
      const base = await tempDir('garbage');
      const target = path.join(base, 'target');
      await fs.mkdir(target);
      await fs.writeFile(path.join(base, 'garbage'), 'this is not an archive at all'.repeat(100));
      await stasisError(unpackCheckpoint(path.join(base, 'garbage'), target), 'CHECKPOINT_INVALID');
      const whole = craft([dir('workspace/'), { path: 'workspace/big', type: 'File', data: Buffer.alloc(100_000, 7) }]);
      await fs.writeFile(path.join(base, 'truncated'), whole.subarray(0, Math.floor(whole.length / 2)));
      await stasisError(unpackCheckpoint(path.join(base, 'truncated'), target), 'CHECKPOINT_INVALID');
      expect(await fs.readdir(target)).toEqual([]);
    });
  });
});
