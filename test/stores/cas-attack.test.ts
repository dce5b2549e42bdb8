import fc from 'fast-check';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { StasisError } from '../../common/errors';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import {
  encodeManifest,
  MANIFEST_SUFFIX,
  MAX_MANIFEST_JSON_BYTES,
  PACKS_DIR,
  PACK_SUFFIX,
  type Manifest,
  type ManifestEntry,
} from '../../stores/cas/manifest';
import { collectGarbage } from '../../stores/cas/gc';
import { restoreCheckpoint } from '../../stores/cas/restore';
import { zstdCompress, zstdDecompressFile } from '../../stores/cas/zstd';
import { FsCheckpointStore } from '../../stores/fs';
import { s3StoreFromEnv, stasisError, tempDir, uniqueId } from '../providers/helpers';
import { bytes, listNoFollow, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// Attacks on the content-addressed checkpoint engine: a manifest crafted by a
// compromised or buggy earlier writer, packs that expand without bound, a stale
// baseline. Each is refused as CHECKPOINT_INVALID naming what is wrong, or made
// harmless; nothing is ever written outside the restore's own directory.

const store = s3StoreFromEnv(5 * 1024 * 1024);
const OLD_NS = '1700000000000000000';

interface Crafted {
  p: string;
  k: ManifestEntry['k'];
  m?: number;
  l?: string;
  data?: Buffer;
  /** Chunk hashes in place of the file's own (on any kind of entry). */
  c?: string[];
}

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

/** Writes a checkpoint of `entries` (each file one chunk, all chunks in one pack) straight to the store. */
async function craft(target: CheckpointStore, entries: Crafted[], edit?: (manifest: Manifest) => void) {
  const prefix = `checkpoints/${uniqueId('attack')}/`;
  const chunks: Manifest['chunks'] = {};
  const parts: Buffer[] = [];
  let offset = 0;
  const manifestEntries: ManifestEntry[] = entries.map((entry) => {
    const data = entry.data ?? Buffer.alloc(0);
    const hashes: string[] = [];
    if (entry.k === 'f' && data.length > 0) {
      const hash = sha256(data);
      hashes.push(hash);
      if (!chunks[hash]) {
        chunks[hash] = [0, offset, data.length];
        parts.push(data);
        offset += data.length;
      }
    }
    return {
      p: entry.p,
      k: entry.k,
      m: entry.m ?? (entry.k === 'd' ? 0o755 : 0o644),
      s: entry.k === 'f' ? data.length : 0,
      mt: OLD_NS,
      ct: OLD_NS,
      ...(entry.l !== undefined ? { l: entry.l } : {}),
      ...(entry.k === 'f' ? { c: hashes } : {}),
      ...(entry.c ? { c: entry.c } : {}),
    };
  });
  const packs: Manifest['packs'] = [];
  if (parts.length > 0) {
    const plain = Buffer.concat(parts);
    const stored = await target.put(
      `${prefix}${PACKS_DIR}${sha256(plain)}${PACK_SUFFIX}`,
      Readable.from([await zstdCompress(plain)]),
      {},
    );
    packs.push({ ...stored, size: plain.length });
  }
  const manifest: Manifest = { format: 'stasis-cas-1', takenAtNs: OLD_NS, entries: manifestEntries, chunks, packs };
  edit?.(manifest);
  return target.put(`${prefix}${uniqueId('m')}${MANIFEST_SUFFIX}`, Readable.from([await encodeManifest(manifest)]), {
    run: 'r1',
  });
}

async function restoreInto(target: CheckpointStore, checkpoint: Awaited<ReturnType<typeof craft>>, dir: string) {
  return restoreCheckpoint({
    store: target,
    checkpoint,
    targetDir: dir,
    tempPrefix: `${dir}.tmp`,
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { bytes: 0 },
  });
}

/** Every path under `root` with its type (l/d/f), never following a symlink. */
async function listTree(root: string): Promise<string[]> {
  const out: string[] = [];
  for (const relative of await listNoFollow(root)) {
    const stat = await fs.lstat(path.join(root, relative));
    out.push(`${relative} ${stat.isSymbolicLink() ? 'l' : stat.isDirectory() ? 'd' : 'f'}`);
  }
  return out;
}

describe('crafted manifests', () => {
  test('setuid and setgid bits in a manifest never reach the restored files or directories', async () => {
    const checkpoint = await craft(store, [
      { p: 'workspace', k: 'd', m: 0o2775 },
      { p: 'workspace/bin', k: 'd', m: 0o6755 },
      { p: 'workspace/bin/su', k: 'f', m: 0o4755, data: Buffer.from('#!/bin/sh\n') },
      { p: 'workspace/bin/empty', k: 'f', m: 0o6777 },
    ]);
    const { target } = await restoreFresh(store, checkpoint);
    for (const [file, mode] of [
      ['workspace', 0o775],
      ['workspace/bin', 0o755],
      ['workspace/bin/su', 0o755],
      ['workspace/bin/empty', 0o777],
    ] as const) {
      const stat = await fs.stat(path.join(target, file));
      // The sticky bit is left out: whether a file keeps it is the filesystem's choice.
      expect({ file, mode: stat.mode & 0o6777 }).toEqual({ file, mode });
    }
  });

  test('a file whose parent directory the manifest does not list is CHECKPOINT_INVALID naming it', async () => {
    const checkpoint = await craft(store, [
      { p: 'workspace', k: 'd' },
      { p: 'workspace/missing/file', k: 'f', data: Buffer.from('x') },
    ]);
    const err = await stasisError(restoreFresh(store, checkpoint), 'CHECKPOINT_INVALID');
    expect(err.message).toContain('workspace/missing/file');
  });

  test.each(['size', 'bytes'] as const)(
    'a pack whose %s is declared larger than any pack a checkpoint writes is refused before it is downloaded',
    async (field) => {
      const checkpoint = await craft(store, [
        { p: 'workspace', k: 'd' },
        { p: 'workspace/f', k: 'f', data: Buffer.from('content') },
      ]);
      const huge = await craft(
        store,
        [
          { p: 'workspace', k: 'd' },
          { p: 'workspace/f', k: 'f', data: Buffer.from('content') },
        ],
        (manifest) => {
          // Named where no pack is: refused for its size, the store is never asked for it.
          manifest.packs[0][field] = 2 ** 40;
          manifest.packs[0].uri = manifest.packs[0].uri.replace(/[0-9a-f]{64}/, '0'.repeat(64));
        },
      );
      await restoreFresh(store, checkpoint);
      const err = await stasisError(restoreFresh(store, huge), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(`${'0'.repeat(64)}${PACK_SUFFIX}`);
      expect(err.message).toContain(String(2 ** 40));
      expect(err.message).not.toContain('missing');
    },
  );

  const x = Buffer.from('x');
  test.each<[string, Crafted[], ((manifest: Manifest) => void) | undefined, string]>([
    ['a ".." segment', [{ p: 'workspace/../etc/x', k: 'f', data: x }], undefined, 'workspace/../etc/x'],
    ['an absolute path', [{ p: '/workspace/x', k: 'f', data: x }], undefined, '/workspace/x'],
    [
      'a path twice',
      [
        { p: 'workspace/a', k: 'f', data: x },
        { p: 'workspace/a', k: 'd' },
      ],
      undefined,
      'twice',
    ],
    [
      'a file beneath a symlink',
      [
        { p: 'workspace/l', k: 'l', l: '/tmp' },
        { p: 'workspace/l/x', k: 'f', data: x },
      ],
      undefined,
      'workspace/l/x',
    ],
    [
      'a hardlink to a later entry',
      [
        { p: 'workspace/h', k: 'h', l: 'workspace/f' },
        { p: 'workspace/f', k: 'f', data: x },
      ],
      undefined,
      'workspace/h',
    ],
    ['a hardlink outside', [{ p: 'workspace/h', k: 'h', l: '../../etc/passwd' }], undefined, 'workspace/h'],
    [
      "a chunk past its pack's end",
      [{ p: 'workspace/f', k: 'f', data: x }],
      (manifest) => {
        for (const location of Object.values(manifest.chunks)) location[1] = 5;
      },
      'outside its pack',
    ],
    [
      'a chunk in a pack not listed',
      [{ p: 'workspace/f', k: 'f', data: x }],
      (manifest) => {
        for (const location of Object.values(manifest.chunks)) location[0] = 3;
      },
      'outside its pack',
    ],
    [
      'a file whose chunks do not add up to its size',
      [{ p: 'workspace/f', k: 'f', data: x }],
      (manifest) => {
        manifest.entries[1].s = 2;
      },
      'workspace/f',
    ],
    [
      'a symlink with chunks',
      [{ p: 'workspace/l', k: 'l', l: 'x' }],
      (manifest) => {
        manifest.entries[1].c = ['a'.repeat(64)];
      },
      'workspace/l',
    ],
  ])('%s is CHECKPOINT_INVALID naming it, and nothing is written', async (_, entries, edit, named) => {
    const checkpoint = await craft(store, [{ p: 'workspace', k: 'd' }, ...entries], edit);
    const dir = await tempDir('cas-attack-table');
    const err = await stasisError(restoreInto(store, checkpoint, dir), 'CHECKPOINT_INVALID');
    expect(err.message).toContain(named);
    expect(await fs.readdir(dir)).toEqual([]);
  });

  test('random hostile manifests restore inside the target or are CHECKPOINT_INVALID; nothing outside changes', async () => {
    const fsStore = new FsCheckpointStore(await tempDir('cas-attack-store'));
    const segment = fc.constantFrom('a', 'b', '..', '.', '', 'c d');
    const relative = fc.array(segment, { minLength: 0, maxLength: 3 }).map((parts) => parts.join('/'));
    const top = fc.constantFrom('workspace', 'home', '/workspace', 'etc', '..', '.');
    const entryPath = fc.tuple(top, relative).map(([head, rest]) => (rest ? `${head}/${rest}` : head));
    const entry = fc.record({
      p: entryPath,
      k: fc.constantFrom('d' as const, 'f' as const, 'l' as const, 'h' as const),
      m: fc.constantFrom(0o755, 0o644, 0o4755, 0o2777, 0o000, 0o7777),
      // Symlink targets aimed at the victim directory beside the restore, and hardlink targets anywhere.
      l: fc.oneof(entryPath, fc.constantFrom('../victim', '../../victim', '../../../victim', 'VICTIM')),
      data: fc.option(
        fc.uint8Array({ minLength: 1, maxLength: 64 }).map((data) => Buffer.from(data)),
        {
          nil: undefined,
        },
      ),
      // Mostly the file's own chunks; sometimes the hash of "x" (located only if some file holds "x") or none.
      c: fc.option(fc.array(fc.constantFrom(sha256(Buffer.from('x')), '0'.repeat(64)), { maxLength: 2 }), {
        nil: undefined,
        freq: 4,
      }),
    });
    const prelude: Crafted[] = [
      { p: 'workspace', k: 'd' },
      { p: 'home', k: 'd' },
    ];
    await fc.assert(
      fc.asyncProperty(fc.boolean(), fc.array(entry, { minLength: 1, maxLength: 8 }), async (withPrelude, list) => {
        const outer = await tempDir('cas-attack');
        const victim = path.join(outer, 'victim');
        await fs.mkdir(victim);
        const dir = path.join(outer, 'restore');
        await fs.mkdir(dir);
        const crafted = list.map((item) => ({
          ...item,
          l: item.l === 'VICTIM' ? victim : item.l,
          ...(item.k === 'l' || item.k === 'h' ? {} : { l: undefined }),
        }));
        const checkpoint = await craft(fsStore, [...(withPrelude ? prelude : []), ...crafted]);
        try {
          await restoreInto(fsStore, checkpoint, dir);
        } catch (err) {
          if (!(err instanceof StasisError) || err.code !== 'CHECKPOINT_INVALID') throw err;
        }
        // Nothing beside the restore changed (its temporary files are gone too), nothing in the victim.
        expect(await fs.readdir(victim)).toEqual([]);
        expect((await fs.readdir(outer)).sort()).toEqual(['restore', 'victim']);
        // Nothing restored carries setuid or setgid.
        for (const line of await listTree(dir)) {
          const relative = line.slice(0, -2);
          const stat = await fs.lstat(path.join(dir, relative));
          if (!stat.isSymbolicLink()) expect({ relative, suid: stat.mode & 0o6000 }).toEqual({ relative, suid: 0 });
        }
        await fs.chmod(dir, 0o700);
        await fs.rm(outer, { recursive: true, force: true });
      }),
      { numRuns: 100 },
    );
  });
});

describe('manifest bombs', () => {
  test('a manifest expanding past the longest string JSON can parse is refused once it gets there', async () => {
    // 600 MiB of zeros in a few hundred KiB; an 8 GiB one would have crashed the worker past Buffer's limit.
    const bomb = spawnSync('sh', ['-c', 'head -c 629145600 /dev/zero | zstd -1 -q -c'], {
      maxBuffer: 64 * 1024 * 1024,
    });
    expect(bomb.status).toBe(0);
    const prefix = `checkpoints/${uniqueId('bomb')}/`;
    const checkpoint = await store.put(`${prefix}m${MANIFEST_SUFFIX}`, Readable.from([bomb.stdout]), {});
    const err = await stasisError(restoreFresh(store, checkpoint), 'CHECKPOINT_INVALID');
    expect(err.message).toContain(checkpoint.uri);
    expect(err.message).toContain(`exceeds ${MAX_MANIFEST_JSON_BYTES} bytes`);
    const gc = await stasisError(collectGarbage(store, prefix, { graceMs: 0 }), 'CHECKPOINT_INVALID');
    expect(gc.message).toContain(`exceeds ${MAX_MANIFEST_JSON_BYTES} bytes`);
  });
});

describe('zstd', () => {
  test('a pack that expands past its declared size stops there: no bomb on the disk', async () => {
    const dir = await tempDir('cas-bomb');
    const bomb = path.join(dir, 'bomb.zst');
    await fs.writeFile(bomb, await zstdCompress(Buffer.alloc(64 * 1024 * 1024)));
    const out = path.join(dir, 'out');
    const err = await stasisError(zstdDecompressFile(bomb, out, 1000, 'pack p'), 'CHECKPOINT_INVALID');
    expect(err.message).toContain('pack p');
    const written = await fs.stat(out).then(
      (stat) => stat.size,
      () => 0,
    );
    expect(written).toBeLessThanOrEqual(1001);
    await fs.rm(dir, { recursive: true, force: true });
  });
});

describe('baselines', () => {
  test("a baseline of another sandbox's checkpoint is not reused: the new checkpoint restores on its own", async () => {
    const root = await newSandboxRoot();
    await fs.writeFile(path.join(root, 'workspace', 'f'), bytes(5000));
    const other = await take(store, root, uniqueId('other'));
    // The same files under another sandbox (a meta/ directory moved or copied between sandboxes).
    const taken = await take(store, root, uniqueId('mine'), other.baseline);
    const { target } = await restoreFresh(store, taken.checkpoint);
    expect(await fs.readFile(path.join(target, 'workspace', 'f'))).toEqual(
      await fs.readFile(path.join(root, 'workspace', 'f')),
    );
  });
});
