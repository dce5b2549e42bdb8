import fc from 'fast-check';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { deflateRawSync, gunzipSync, gzipSync, inflateRawSync } from 'node:zlib';
import { StasisError } from '../../common/errors';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import {
  encodeManifest,
  MANIFEST_SUFFIX,
  SEGMENT_SUFFIX,
  SEGMENTS_DIR,
  MAX_MANIFEST_JSON_BYTES,
  PACKS_DIR,
  PACK_SUFFIX,
  segmentsPrefixOf,
  ZSTD_MANIFEST_SUFFIX,
  type Manifest,
  type ManifestEntry,
} from '../../stores/cas/manifest';
import { collectGarbage } from '../../stores/cas/gc';
import { restoreCheckpoint } from '../../stores/cas/restore';
import { zstdCompress, zstdDecompressFile, zstdRawFrame } from '../../stores/cas/zstd';
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

/**
 * Writes a checkpoint of `entries` (each file one chunk, all chunks in one pack) straight to the store:
 * `stasis-cas-1` (one object) or `stasis-cas-2` (segments of two entries each, encoded here, not by the
 * code under test, and a top object naming them).
 */
async function craft(
  target: CheckpointStore,
  entries: Crafted[],
  edit?: (manifest: Manifest) => void,
  format: Manifest['format'] = 'stasis-cas-1',
  /** The pack as upload stores incompressible chunks (a frame of raw blocks), not compressed by zstd. */
  raw = false,
  /** `stasis-cas-2`: every chunk located by the last segment alone, none by the segment of its file. */
  locatedLast = false,
) {
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
      Readable.from(raw ? zstdRawFrame([plain], plain.length) : [await zstdCompress(plain)]),
      {},
    );
    packs.push({ ...stored, size: plain.length });
  }
  const manifest: Manifest = { format: 'stasis-cas-1', takenAtNs: OLD_NS, entries: manifestEntries, chunks, packs };
  edit?.(manifest);
  // `stasis-cas-1` as earlier versions wrote it (zstd); `stasis-cas-2` as now (gzip).
  const [body, suffix] =
    format === 'stasis-cas-1'
      ? [await encodeManifest(manifest), ZSTD_MANIFEST_SUFFIX]
      : [await segmented(target, prefix, manifest, locatedLast, format), MANIFEST_SUFFIX];
  return target.put(`${prefix}${uniqueId('m')}${suffix}`, Readable.from([body]), { run: 'r1' });
}

/** The top object of `manifest` as `stasis-cas-2`, its segments stored. */
async function segmented(
  target: CheckpointStore,
  prefix: string,
  manifest: Manifest,
  locatedLast = false,
  format: Manifest['format'] = 'stasis-cas-2',
): Promise<Buffer> {
  const segments: [string, number, number, number][] = [];
  for (let from = 0; from < manifest.entries.length; from += 2) {
    const entries = manifest.entries.slice(from, from + 2);
    const segmentChunks: Record<string, [number, number, number]> = {};
    const last = from + 2 >= manifest.entries.length;
    for (const entry of locatedLast ? (last ? manifest.entries : []) : entries) {
      for (const hash of entry.c ?? []) {
        if (manifest.chunks[hash]) segmentChunks[hash] = manifest.chunks[hash];
      }
    }
    // Pack i of the segment is pack i of the manifest; a pack the manifest does not have gets a name nothing stores.
    const used = Math.max(0, ...Object.values(segmentChunks).map(([pack]) => pack + 1));
    const names = Array.from({ length: used }, (_, i) =>
      manifest.packs[i] ? /([0-9a-f]{64})\.pack$/.exec(manifest.packs[i].uri)![1] : 'f'.repeat(64),
    );
    const json = Buffer.from(
      JSON.stringify({ format: 'stasis-cas-2-segment', packs: names, chunks: segmentChunks, entries }),
    );
    const stored = deflateRawSync(json);
    await target.put(`${prefix}${SEGMENTS_DIR}${sha256(json)}${SEGMENT_SUFFIX}`, Readable.from([stored]), {});
    segments.push([sha256(json), stored.length, json.length, entries.length]);
  }
  const top = { format, takenAtNs: manifest.takenAtNs, segments, packs: manifest.packs };
  return gzipSync(Buffer.from(JSON.stringify(top)));
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

/** Nothing restored into `dir` carries setuid or setgid. */
async function expectNoSetIds(dir: string): Promise<void> {
  for (const line of await listTree(dir)) {
    const relative = line.slice(0, -2);
    const stat = await fs.lstat(path.join(dir, relative));
    if (!stat.isSymbolicLink()) expect({ relative, suid: stat.mode & 0o6000 }).toEqual({ relative, suid: 0 });
  }
}

describe('crafted manifests', () => {
  test('a chunk whose bytes do not hash to its name is CHECKPOINT_INVALID naming it, in a raw pack as in a zstd one; none of its bytes written', async () => {
    for (const raw of [true, false]) {
      const data = bytes(300_000);
      const named = sha256(Buffer.from(`not the bytes ${raw}`));
      const checkpoint = await craft(
        store,
        [
          { p: 'workspace', k: 'd' },
          { p: 'workspace/a.bin', k: 'f', data },
        ],
        (manifest) => {
          // The pack and its recorded sha-256 are intact: only the chunk's name is not its bytes' hash.
          manifest.chunks[named] = manifest.chunks[sha256(data)];
          delete manifest.chunks[sha256(data)];
          manifest.entries[1].c = [named];
        },
        'stasis-cas-2',
        raw,
      );
      const dir = await tempDir('cas-attack-chunk');
      const err = await stasisError(restoreInto(store, checkpoint, dir), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(`corrupt chunk ${named}`);
      expect(err.message).toContain(sha256(data));
      // Opened before its chunk came (the caller removes the staging directory): none of the bytes reached it.
      const written = await fs.stat(path.join(dir, 'workspace', 'a.bin')).then(
        (stat) => stat.size,
        () => 0,
      );
      expect(written).toBe(0);
    }
  });

  test('a corrupt chunk after a good one of the same file: CHECKPOINT_INVALID naming it, only the good bytes written, the file closed', async () => {
    // Alone, the file is written as its pack comes (the writer waits); after another file of that
    // pack, it is written from the pack already loaded (without waiting): both ways fail alike.
    for (const before of [false, true]) {
      const good = bytes(70_000);
      const bad = Buffer.from(bytes(50_000).map((b) => b ^ 0x5a));
      const named = sha256(Buffer.from(`not the second chunk ${before}`));
      const file = before ? 2 : 1;
      const checkpoint = await craft(
        store,
        [
          { p: 'workspace', k: 'd' },
          ...(before ? [{ p: 'workspace/0.bin', k: 'f' as const, data: bytes(1000).reverse() }] : []),
          { p: 'workspace/a.bin', k: 'f', data: Buffer.concat([good, bad]) },
        ],
        (manifest) => {
          // The file's bytes as two chunks of the pack: the first named by its hash, the second not.
          const [whole] = manifest.entries[file].c!;
          const [pack, offset] = manifest.chunks[whole];
          delete manifest.chunks[whole];
          manifest.chunks[sha256(good)] = [pack, offset, good.length];
          manifest.chunks[named] = [pack, offset + good.length, bad.length];
          manifest.entries[file].c = [sha256(good), named];
        },
        'stasis-cas-2',
      );
      const dir = await tempDir('cas-attack-second-chunk');
      const err = await stasisError(restoreInto(store, checkpoint, dir), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(`corrupt chunk ${named}`);
      expect(err.message).toContain(sha256(bad));
      expect((await fs.readFile(path.join(dir, 'workspace', 'a.bin'))).equals(good)).toBe(true);
      // No descriptor of this process is left on the file the restore gave up on.
      const open = await Promise.all(
        (await fs.readdir('/proc/self/fd')).map((fd) => fs.readlink(`/proc/self/fd/${fd}`).catch(() => '')),
      );
      expect(open.filter((target) => target.startsWith(dir))).toEqual([]);
    }
  });

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
  type Named = string | Record<'stasis-cas-1' | 'stasis-cas-2', string>;
  const cases: [string, Crafted[], ((manifest: Manifest) => void) | undefined, Named][] = [
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
      {
        'stasis-cas-1': 'outside its pack',
        'stasis-cas-2': `names a pack "${'f'.repeat(64)}" the checkpoint does not list`,
      },
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
  ];
  describe.each(['stasis-cas-1', 'stasis-cas-2'] as const)('%s', (format) => {
    test.each(cases)('%s is CHECKPOINT_INVALID naming it, and nothing is written', async (_, entries, edit, named) => {
      const checkpoint = await craft(store, [{ p: 'workspace', k: 'd' }, ...entries], edit, format);
      const dir = await tempDir('cas-attack-table');
      const err = await stasisError(restoreInto(store, checkpoint, dir), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(typeof named === 'string' ? named : named[format]);
      expect(await fs.readdir(dir)).toEqual([]);
    });
  });

  // Names that are not UTF-8 are held escaped (stores/raw-names.ts: each byte from 0x80 up as U+DC80..U+DCFF).
  // A crafted manifest may hold any string: one that is no escape of a name's bytes is refused, naming it.
  const unnamed: [string, Crafted[], string][] = [
    ['a lone surrogate outside U+DC80..U+DCFF', [{ p: 'workspace/a\uD800b', k: 'f', data: x }], 'workspace/a\\ud800b'],
    ['a lone high surrogate at the end', [{ p: 'workspace/a\uDBFF', k: 'd' }], 'workspace/a\\udbff'],
    ['an escaped ".."', [{ p: 'workspace/\uDC2E\uDC2E/x', k: 'f', data: x }], 'workspace/\\udc2e\\udc2e/x'],
    ['an escaped "/"', [{ p: 'workspace/a\uDC2Fb', k: 'f', data: x }], 'workspace/a\\udc2fb'],
    ['an escaped NUL', [{ p: 'workspace/a\uDC00b', k: 'f', data: x }], 'workspace/a\\udc00b'],
    // C3 A9 is "é": escaped, it would write the very file "workspace/é" names.
    [
      'escaped bytes that are valid UTF-8',
      [
        { p: 'workspace/\u00e9', k: 'f', data: x },
        { p: 'workspace/\uDCC3\uDCA9', k: 'f', data: x },
      ],
      'workspace/\\udcc3\\udca9',
    ],
    ['a symlink whose target is no escape', [{ p: 'workspace/l', k: 'l', l: '../\uDE00x' }], 'workspace/l'],
  ];
  describe.each(['stasis-cas-1', 'stasis-cas-2', 'stasis-cas-3'] as const)('%s', (format) => {
    test.each(unnamed)('%s is CHECKPOINT_INVALID naming it, and nothing is written', async (_, entries, named) => {
      const checkpoint = await craft(store, [{ p: 'workspace', k: 'd' }, ...entries], undefined, format);
      const outer = await tempDir('cas-attack-names');
      const dir = path.join(outer, 'target');
      await fs.mkdir(dir);
      const err = await stasisError(restoreInto(store, checkpoint, dir), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(named);
      expect(err.message).toContain('no escaped byte of a name');
      expect(await fs.readdir(dir)).toEqual([]);
      expect(await fs.readdir(outer, { encoding: 'buffer' })).toEqual([Buffer.from('target')]);
    });
  });

  test('a crafted stasis-cas-3 manifest of escaped names that are bytes restores them as those bytes', async () => {
    const checkpoint = await craft(
      store,
      [
        { p: 'workspace', k: 'd' },
        { p: 'workspace/\uDCFFd', k: 'd' },
        { p: 'workspace/\uDCFFd/f\uDCE9', k: 'f', data: x },
        { p: 'workspace/l', k: 'l', l: '\uDCFE/t' },
      ],
      undefined,
      'stasis-cas-3',
    );
    const dir = await tempDir('cas-attack-names');
    await restoreInto(store, checkpoint, dir);
    const workspace = Buffer.from(`${dir}/workspace/`);
    expect((await fs.readdir(workspace, { encoding: 'buffer' })).sort(Buffer.compare)).toEqual([
      Buffer.from('l'),
      Buffer.from([0xff, 0x64]),
    ]);
    const sub = Buffer.concat([workspace, Buffer.from([0xff, 0x64, 0x2f])]);
    expect(await fs.readdir(sub, { encoding: 'buffer' })).toEqual([Buffer.from([0x66, 0xe9])]);
    expect(await fs.readFile(Buffer.concat([sub, Buffer.from([0x66, 0xe9])]))).toEqual(x);
    expect(await fs.readlink(Buffer.concat([workspace, Buffer.from('l')]), { encoding: 'buffer' })).toEqual(
      Buffer.from([0xfe, 0x2f, 0x74]),
    );
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
      fc.asyncProperty(
        fc.boolean(),
        fc.array(entry, { minLength: 1, maxLength: 8 }),
        fc.constantFrom('stasis-cas-1' as const, 'stasis-cas-2' as const),
        async (withPrelude, list, format) => {
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
          const checkpoint = await craft(fsStore, [...(withPrelude ? prelude : []), ...crafted], undefined, format);
          try {
            await restoreInto(fsStore, checkpoint, dir);
          } catch (err) {
            if (!(err instanceof StasisError) || err.code !== 'CHECKPOINT_INVALID') throw err;
          }
          // Nothing beside the restore changed (its temporary files are gone too), nothing in the victim.
          expect(await fs.readdir(victim)).toEqual([]);
          expect((await fs.readdir(outer)).sort()).toEqual(['restore', 'victim']);
          await expectNoSetIds(dir);
          await fs.chmod(dir, 0o700);
          await fs.rm(outer, { recursive: true, force: true });
        },
      ),
      { numRuns: 100 },
    );
  });
});

describe('a manifest checked while its segments arrive', () => {
  // Restore checks each segment's entries as it arrives and the rest once all are in: still nothing is
  // written before the whole manifest passed, wherever in it the fault is.
  const files = (count: number): Crafted[] => [
    { p: 'workspace', k: 'd' },
    ...Array.from({ length: count }, (_, i) => ({
      p: `workspace/f${i}`,
      k: 'f' as const,
      data: Buffer.from(`file ${i}`),
    })),
  ];

  test('chunks located only by a later segment than their files restore byte for byte', async () => {
    const fsStore = new FsCheckpointStore(await tempDir('cas-late-store'));
    const checkpoint = await craft(fsStore, files(9), undefined, 'stasis-cas-2', false, true);
    const dir = await tempDir('cas-late');
    await restoreInto(fsStore, checkpoint, dir);
    for (let i = 0; i < 9; i += 1)
      expect(await fs.readFile(path.join(dir, `workspace/f${i}`), 'utf8')).toBe(`file ${i}`);
  });

  test('property: one bad entry anywhere among many segments is CHECKPOINT_INVALID naming it, and nothing is written', async () => {
    const fsStore = new FsCheckpointStore(await tempDir('cas-late-store'));
    const faults: Record<string, (entry: ManifestEntry) => void> = {
      escape: (entry) => (entry.p = 'workspace/../../victim'),
      'no parent': (entry) => (entry.p = 'workspace/nowhere/x'),
      size: (entry) => (entry.s += 1),
      unlocated: (entry) => (entry.c = ['e'.repeat(64)]),
    };
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 12 }),
        fc.nat(),
        fc.constantFrom(...Object.keys(faults)),
        fc.boolean(),
        async (count, at, fault, locatedLast) => {
          const index = 1 + (at % count);
          const checkpoint = await craft(
            fsStore,
            files(count),
            (manifest) => faults[fault](manifest.entries[index]),
            'stasis-cas-2',
            false,
            locatedLast,
          );
          const dir = await tempDir('cas-late');
          const err = await stasisError(restoreInto(fsStore, checkpoint, dir), 'CHECKPOINT_INVALID');
          expect(err.message).toContain(
            fault === 'unlocated' ? 'e'.repeat(64) : fault === 'escape' ? 'victim' : 'workspace/',
          );
          expect(await fs.readdir(dir)).toEqual([]);
          await fs.rm(dir, { recursive: true, force: true });
        },
      ),
      { numRuns: 40 },
    );
  });
});

describe('manifests from the wire', () => {
  // Bytes as a store could hand them back: a real checkpoint's top object or one of its segments,
  // mutated in its JSON (then stored as the writer would: a segment under the hash of its new bytes,
  // so it passes the hash check and reaches the parser) or in its compressed bytes; the top object
  // gzip as written now or zstd as earlier versions wrote it (its key's ending says which). Restore either
  // restores inside its directory or refuses with CHECKPOINT_INVALID; no other error, nothing outside.
  test('mutated top objects and segments restore inside the target or are CHECKPOINT_INVALID', async () => {
    const fsStore = new FsCheckpointStore(await tempDir('cas-wire-store'));
    const root = await newSandboxRoot();
    // Enough entries for a few segments (their boundaries depend on the paths alone).
    for (let d = 0; d < 6; d += 1) {
      await fs.mkdir(path.join(root, 'workspace', `d${d}`));
      for (let i = 0; i < 80; i += 1) await fs.writeFile(path.join(root, 'workspace', `d${d}`, `f${i}`), bytes(i % 9));
    }
    await fs.symlink('../d0/f1', path.join(root, 'workspace', 'd1', 'link'));
    await fs.link(path.join(root, 'workspace', 'd2', 'f3'), path.join(root, 'workspace', 'd3', 'hard'));
    const sandboxId = uniqueId('wire');
    const prefix = `checkpoints/${sandboxId}/`;
    const taken = await take(fsStore, root, sandboxId);
    const segments = taken.baseline.manifest.segments!;
    expect(segments.length).toBeGreaterThan(1);
    expect(taken.checkpoint.uri.endsWith(MANIFEST_SUFFIX)).toBe(true);
    const topJson = gunzipSync(await fsStore.read(taken.checkpoint.uri, 1 << 20));
    const segmentUri = (name: string) => `${segmentsPrefixOf(taken.checkpoint.uri)}${name}${SEGMENT_SUFFIX}`;
    const segmentStored = await Promise.all(segments.map(([name]) => fsStore.read(segmentUri(name), 1 << 24)));
    const segmentJson = segmentStored.map((stored) => inflateRawSync(stored));

    const tokens = ['"..', '/', '"../../', '-1', '1e309', '[]', '{}', 'null', '"__proto__"', '0', '4294967296'];
    const mutation = fc.oneof(
      fc.record({ kind: fc.constant('set' as const), at: fc.nat(), byte: fc.integer({ min: 0, max: 255 }) }),
      fc.record({ kind: fc.constant('insert' as const), at: fc.nat(), bytes: fc.uint8Array({ maxLength: 8 }) }),
      fc.record({ kind: fc.constant('delete' as const), at: fc.nat(), length: fc.integer({ min: 1, max: 16 }) }),
      fc.record({
        kind: fc.constant('token' as const),
        at: fc.nat(),
        token: fc.constantFrom(...tokens, '"d"', '"l"', '"h"', '"/etc"', ',', '"workspace"', '\u0000'),
      }),
      fc.record({ kind: fc.constant('truncate' as const), at: fc.nat() }),
      // The next digit from `at` replaced by another: mostly still JSON, often still a valid manifest.
      fc.record({ kind: fc.constant('digit' as const), at: fc.nat(), digit: fc.integer({ min: 0, max: 9 }) }),
    );
    type Mutation = typeof mutation extends fc.Arbitrary<infer M> ? M : never;
    const mutate = (data: Buffer, mutations: readonly Mutation[]): Buffer => {
      let out = Buffer.from(data);
      for (const m of mutations) {
        const at = out.length === 0 ? 0 : m.at % (out.length + 1);
        if (m.kind === 'set' && at < out.length) out[at] = m.byte;
        if (m.kind === 'insert') out = Buffer.concat([out.subarray(0, at), Buffer.from(m.bytes), out.subarray(at)]);
        if (m.kind === 'delete') out = Buffer.concat([out.subarray(0, at), out.subarray(at + m.length)]);
        if (m.kind === 'token') out = Buffer.concat([out.subarray(0, at), Buffer.from(m.token), out.subarray(at)]);
        if (m.kind === 'truncate') out = out.subarray(0, at);
        if (m.kind === 'digit') {
          const next = out.findIndex((byte, i) => i >= at && byte >= 0x30 && byte <= 0x39);
          if (next >= 0) out[next] = 0x30 + m.digit;
        }
      }
      return out;
    };
    // One mutation known to leave a valid manifest, so the property always sees one restore: the last
    // digit of the first entry's mtime (written to the microsecond, so a 0) becomes a 7.
    const firstSegment = segmentJson[0].toString('latin1');
    const mtAt = firstSegment.indexOf('"mt":"') + '"mt":"'.length;
    expect(mtAt).toBeGreaterThan('"mt":"'.length - 1);
    const harmless: Mutation = { kind: 'digit', at: firstSegment.indexOf('"', mtAt) - 1, digit: 7 };
    let restoredWhole = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.nat(segments.length),
        fc.boolean(),
        fc.array(mutation, { minLength: 1, maxLength: 4 }),
        fc.constantFrom('gzip', 'zstd'),
        async (which, compressed, mutations, codec) => {
          let top = topJson.toString();
          if (which === 0) {
            // The top object itself.
            if (!compressed) top = mutate(topJson, mutations).toString('latin1');
          } else {
            const [name, , , count] = segments[which - 1];
            let stored: Buffer;
            let json: Buffer;
            let newName: string;
            if (compressed) {
              // Its stored bytes changed under its old name.
              stored = mutate(deflateRawSync(segmentJson[which - 1]), mutations);
              json = segmentJson[which - 1];
              newName = name;
            } else {
              json = mutate(segmentJson[which - 1], mutations);
              stored = deflateRawSync(json);
              newName = sha256(json);
            }
            await fsStore.put(`${prefix}${SEGMENTS_DIR}${newName}${SEGMENT_SUFFIX}`, Readable.from([stored]), {});
            const tuple = JSON.stringify(segments[which - 1]);
            top = top.replace(
              tuple,
              JSON.stringify([newName, Math.max(1, stored.length), Math.max(1, json.length), count]),
            );
          }
          const json = Buffer.from(top, which === 0 && !compressed ? 'latin1' : 'utf8');
          let body = codec === 'gzip' ? gzipSync(json) : await zstdCompress(json);
          if (which === 0 && compressed) body = mutate(body, mutations);
          const suffix = codec === 'gzip' ? MANIFEST_SUFFIX : ZSTD_MANIFEST_SUFFIX;
          const checkpoint = await fsStore.put(`${prefix}${uniqueId('m')}${suffix}`, Readable.from([body]), {});
          const outer = await tempDir('cas-wire');
          const dir = path.join(outer, 'restore');
          await fs.mkdir(dir);
          try {
            await restoreInto(fsStore, checkpoint, dir);
            restoredWhole += 1;
          } catch (err) {
            if (!(err instanceof StasisError) || err.code !== 'CHECKPOINT_INVALID') throw err;
          }
          expect((await fs.readdir(outer)).sort()).toEqual(['restore']);
          await expectNoSetIds(dir);
          await fs.chmod(dir, 0o700);
          await fs.rm(outer, { recursive: true, force: true });
          await fsStore.delete(checkpoint.uri);
          // A segment's own bytes back under its name for the next run.
          if (which > 0) {
            const key = `${prefix}${SEGMENTS_DIR}${segments[which - 1][0]}${SEGMENT_SUFFIX}`;
            await fsStore.put(key, Readable.from([segmentStored[which - 1]]), {});
          }
        },
      ),
      { numRuns: 150, examples: [[1, false, [harmless], 'gzip']] },
    );
    // Some mutations leave a valid manifest (a changed mtime digit, a byte of a name): those restore.
    expect(restoredWhole).toBeGreaterThan(0);
  });
});

describe('manifest bombs', () => {
  for (const [codec, command, suffix] of [
    ['gzip', 'gzip -1 -c', MANIFEST_SUFFIX],
    ['zstd', 'zstd -1 -q -c', ZSTD_MANIFEST_SUFFIX],
  ] as const) {
    test(`a manifest (${codec}) expanding past the longest string JSON can parse is refused once it gets there`, async () => {
      // 600 MiB of zeros in a few hundred KiB; an 8 GiB one would have crashed the worker past Buffer's limit.
      const bomb = spawnSync('sh', ['-c', `head -c 629145600 /dev/zero | ${command}`], {
        maxBuffer: 64 * 1024 * 1024,
      });
      expect(bomb.status).toBe(0);
      const prefix = `checkpoints/${uniqueId('bomb')}/`;
      const checkpoint = await store.put(`${prefix}m${suffix}`, Readable.from([bomb.stdout]), {});
      const err = await stasisError(restoreFresh(store, checkpoint), 'CHECKPOINT_INVALID');
      expect(err.message).toContain(checkpoint.uri);
      expect(err.message).toContain(`exceeds ${MAX_MANIFEST_JSON_BYTES} bytes`);
      const gc = await stasisError(collectGarbage(store, prefix, { graceMs: 0 }), 'CHECKPOINT_INVALID');
      expect(gc.message).toContain(`exceeds ${MAX_MANIFEST_JSON_BYTES} bytes`);
    });
  }
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
