import fc from 'fast-check';
import { createWriteStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { gunzipSync } from 'node:zlib';
import { removeTree } from '../../providers/files';
import { packSandbox } from '../../stores/archive';
import { ManifestV1 } from '../../stores/cas/manifest';
import { rawTree } from '../helpers/raw-tree';
import { s3StoreFromEnv, stasisError, tempDir, uniqueId } from '../providers/helpers';
import { newSandboxRoot, restoreFresh, take } from './cas-helpers';

// Names are bytes on Linux (any but `/` and NUL); Node lists one that is not UTF-8 with U+FFFD in place
// of its bytes, a name that opens nothing, or another file that has that very spelling. A checkpoint
// holds every name as its bytes (stores/raw-names.ts) and restores it byte for byte: a sandbox that
// makes one (`touch $'\xff'`) must neither lose it nor keep its compute held (a refused checkpoint
// never terminates it). Real files, real MinIO.

const store = s3StoreFromEnv(5 * 1024 * 1024);

/** `workspace/<bytes>` as a Buffer path under `root`. */
const rawPath = (root: string, ...names: Buffer[]) =>
  Buffer.concat([Buffer.from(`${root}/workspace`), ...names.flatMap((name) => [Buffer.from('/'), name])]);

/** The top object of a checkpoint, as its JSON. */
async function topOf(uri: string): Promise<Record<string, unknown>> {
  return JSON.parse(gunzipSync(await store.read(uri, 1024 * 1024)).toString('utf8')) as Record<string, unknown>;
}

it('a tree with names and a symlink target that are not UTF-8 is checkpointed and restored byte for byte', async () => {
  const root = await newSandboxRoot();
  await fs.writeFile(path.join(root, 'workspace', 'ok.txt'), 'ok\n');
  const bad = Buffer.from([0x62, 0x61, 0x64, 0xff, 0x6e]);
  await fs.writeFile(rawPath(root, bad), 'kept\n');
  // Spelled like `bad` once decoded lossily: a distinct file.
  await fs.writeFile(rawPath(root, Buffer.from('bad\uFFFDn')), 'the real U+FFFD\n');
  await fs.mkdir(rawPath(root, Buffer.from([0xe9, 0x74, 0xe9])));
  await fs.writeFile(rawPath(root, Buffer.from([0xe9, 0x74, 0xe9]), Buffer.from([0xc0, 0xaf])), 'inner\n', {
    mode: 0o600,
  });
  await fs.symlink(Buffer.from([0x2e, 0x2e, 0x2f, 0xfe, 0x2f, 0xed, 0xb2, 0x80]), rawPath(root, Buffer.from('link')));
  const sandboxId = uniqueId('names');
  const taken = await take(store, root, sandboxId);
  // Readers before stasis-cas-3 would write an escaped name as U+FFFD bytes: they are given a format they refuse.
  expect((await topOf(taken.checkpoint.uri)).format).toBe('stasis-cas-3');
  const { target } = await restoreFresh(store, taken.checkpoint);
  const restored = await rawTree(path.join(target, 'workspace'));
  expect(restored).toEqual(await rawTree(path.join(root, 'workspace')));
  expect(restored).toContain(`${Buffer.from('link').toString('hex')} link 2e2e2ffe2fedb280`);
  expect(restored.filter((line) => line.startsWith(bad.toString('hex')))).toHaveLength(1);
  expect(await fs.readFile(rawPath(target, bad), 'utf8')).toBe('kept\n');
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});

it('a name spelled with U+FFFD itself (valid UTF-8) is checkpointed and restored, as stasis-cas-2', async () => {
  const root = await newSandboxRoot();
  await fs.writeFile(path.join(root, 'workspace', 'c\uFFFD'), 'replacement character\n');
  // Valid names that look like escapes are text, kept as text.
  await fs.writeFile(path.join(root, 'workspace', '\\xff'), 'backslash x f f\n');
  await fs.symlink('\\udcff', path.join(root, 'workspace', 'l'));
  const sandboxId = uniqueId('names');
  const taken = await take(store, root, sandboxId);
  // Trees of UTF-8 names keep the format every worker reads.
  expect((await topOf(taken.checkpoint.uri)).format).toBe('stasis-cas-2');
  const { target } = await restoreFresh(store, taken.checkpoint);
  expect(await rawTree(target)).toEqual(await rawTree(root));
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});

it("a stasis-cas-3 top object is one today's stasis-cas-2 readers refuse", async () => {
  const root = await newSandboxRoot();
  await fs.writeFile(rawPath(root, Buffer.from([0xff])), 'x');
  const sandboxId = uniqueId('names');
  const taken = await take(store, root, sandboxId);
  const top = await topOf(taken.checkpoint.uri);
  // A reader of stasis-cas-2 reads a top object of any other format as stasis-cas-1, which this is not.
  expect(top.format).not.toBe('stasis-cas-2');
  expect(ManifestV1.safeParse(top).success).toBe(false);
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});

it('an unchanged re-suspend after a restore of names that are not UTF-8 uploads no file data', async () => {
  const root = await newSandboxRoot();
  const dir = Buffer.from([0x64, 0xfe]);
  await fs.mkdir(rawPath(root, dir));
  for (let i = 0; i < 20; i += 1) {
    await fs.writeFile(rawPath(root, dir, Buffer.from([0x66, 0x80 + i, 0xff])), `file ${i}\n`.repeat(100));
  }
  await fs.symlink(Buffer.from([0xff, 0x2f, 0xfe]), rawPath(root, Buffer.from([0x6c, 0xff])));
  const sandboxId = uniqueId('names');
  const first = await take(store, root, sandboxId);
  expect(first.stats.filesHashed).toBe(20);
  const { target, baseline } = await restoreFresh(store, first.checkpoint);
  const again = await take(store, target, sandboxId, baseline);
  // Every file vouched for by the restore's baseline: none read, no pack uploaded.
  expect(again.stats.files).toBe(20);
  expect(again.stats.filesHashed).toBe(0);
  expect(again.stats.packs).toBe(0);
  expect(again.stats.packBytes).toBe(0);
  // And again from the re-suspend's own baseline: not even a segment.
  const third = await take(store, target, sandboxId, again.baseline);
  expect(third.stats.filesHashed).toBe(0);
  expect(third.stats.packs).toBe(0);
  expect(third.stats.segments).toBe(0);
  const { target: last } = await restoreFresh(store, third.checkpoint);
  expect(await rawTree(last)).toEqual(await rawTree(root));
  // A change to one escaped file is seen: that file alone is read again.
  await fs.appendFile(rawPath(target, dir, Buffer.from([0x66, 0x85, 0xff])), 'changed\n');
  const changed = await take(store, target, sandboxId, third.baseline);
  expect(changed.stats.filesHashed).toBe(1);
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});

/** A name: 1..255 bytes, no `/`, no NUL, not `.` or `..`; invalid UTF-8 and its lookalikes mixed in. */
const nameBytes = fc
  .oneof(
    fc.uint8Array({ minLength: 1, maxLength: 255 }),
    fc.uint8Array({ minLength: 1, maxLength: 8 }).map((bytes) => bytes.map((b) => 0x80 | b)),
    fc.constantFrom(
      [0xff],
      [0xfe, 0xff],
      [0xc0, 0xaf], // overlong `/`
      [0xe0, 0x80, 0xaf], // overlong `/`, three bytes
      [0xc0, 0xae, 0xc0, 0xae], // overlong `..`
      [0xed, 0xb2, 0x80], // CESU-8 of U+DC80
      [0xed, 0xa0, 0x80, 0xed, 0xb0, 0x80], // CESU-8 pair
      [0xef, 0xbf, 0xbd], // U+FFFD itself
      [0x63, 0xff],
      [0x63, 0xef, 0xbf, 0xbd], // "c" + U+FFFD: what [0x63, 0xff] reads as lossily
      [0xf4, 0x90, 0x80, 0x80], // past U+10FFFF
      [0xf0, 0x9f, 0x98, 0x80], // an emoji: a surrogate pair in JS
      [0xf0, 0x9f, 0x98], // a truncated emoji
      [...Buffer.from('\\udcff')],
      [...Buffer.from('\\xff')],
    ),
    fc
      .tuple(fc.string({ minLength: 1, maxLength: 10 }), fc.uint8Array({ minLength: 1, maxLength: 4 }))
      .map(([text, tail]) => [...Buffer.from(text), ...tail]),
  )
  .map((bytes) => Buffer.from([...bytes].filter((b) => b !== 0 && b !== 0x2f).slice(0, 255)))
  .filter((name) => name.length > 0 && !name.equals(Buffer.from('.')) && !name.equals(Buffer.from('..')));

/** A symlink target: any bytes but NUL (`/` included). */
const targetBytes = fc
  .oneof(
    fc.uint8Array({ minLength: 1, maxLength: 300 }),
    nameBytes.map((name) => [...name, 0x2f, ...name]),
  )
  .map((bytes) => Buffer.from([...bytes].filter((b) => b !== 0)))
  .filter((target) => target.length > 0);

const node = fc.oneof(
  fc.record({
    kind: fc.constant('file' as const),
    data: fc.uint8Array({ maxLength: 64 }),
    mode: fc.constantFrom(0o644, 0o600, 0o755),
  }),
  fc.record({ kind: fc.constant('link' as const), target: targetBytes }),
  fc.record({
    kind: fc.constant('dir' as const),
    inner: fc.uniqueArray(fc.tuple(nameBytes, fc.uint8Array({ maxLength: 16 })), {
      maxLength: 3,
      selector: ([name]) => name.toString('hex'),
    }),
  }),
);

it('property: any names and symlink targets Linux allows are restored from the store byte for byte', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.uniqueArray(fc.tuple(nameBytes, node), {
        minLength: 1,
        maxLength: 8,
        selector: ([name]) => name.toString('hex'),
      }),
      async (tree) => {
        const root = await newSandboxRoot();
        for (const [name, entry] of tree) {
          const where = rawPath(root, name);
          if (entry.kind === 'file') await fs.writeFile(where, entry.data, { mode: entry.mode });
          else if (entry.kind === 'link') await fs.symlink(entry.target, where);
          else {
            await fs.mkdir(where);
            for (const [inner, data] of entry.inner) await fs.writeFile(rawPath(root, name, inner), data);
          }
        }
        const before = await rawTree(root);
        const sandboxId = uniqueId('names-prop');
        try {
          const taken = await take(store, root, sandboxId);
          const { target } = await restoreFresh(store, taken.checkpoint);
          expect(await rawTree(target)).toEqual(before);
          // The source was not touched either.
          expect(await rawTree(root)).toEqual(before);
          expect(before.filter((line) => line.includes(' ')).length).toBeGreaterThanOrEqual(tree.length + 3);
        } finally {
          await store.deletePrefix(`checkpoints/${sandboxId}/`);
        }
      },
    ),
    { numRuns: 100 },
  );
}, 300_000);

it('the tar.gz format (written only without the zstd command) refuses a name that is not UTF-8, naming it', async () => {
  const root = await newSandboxRoot();
  await fs.writeFile(path.join(root, 'workspace', 'ok.txt'), 'ok\n');
  await fs.writeFile(rawPath(root, Buffer.from([0x62, 0x61, 0x64, 0xff, 0x6e])), 'not utf-8\n');
  const out = path.join(await tempDir('names-tar'), 'c.tar.gz');
  const err = await stasisError(
    pipeline(packSandbox(root, ['workspace']), createWriteStream(out)),
    'CHECKPOINT_INVALID',
  );
  expect(err.message).toContain('workspace/bad\\\\xffn');
  expect(err.message).toContain('tar.gz checkpoint cannot name');
});

it('a tree with names that are not UTF-8 (one spelled like a real file once decoded) is removed whole', async () => {
  const parent = await tempDir('names-remove');
  const root = path.join(parent, 'sandbox');
  await fs.mkdir(path.join(root, 'workspace'), { recursive: true });
  await fs.writeFile(path.join(root, 'workspace', 'c\uFFFD'), 'real\n');
  await fs.writeFile(rawPath(root, Buffer.from([0x63, 0xff])), 'not utf-8\n');
  await fs.mkdir(rawPath(root, Buffer.from([0x64, 0xfe])));
  await fs.writeFile(Buffer.concat([rawPath(root, Buffer.from([0x64, 0xfe])), Buffer.from('/inner')]), 'inner\n');
  await removeTree(root);
  expect(await fs.readdir(parent)).toEqual([]);
});
