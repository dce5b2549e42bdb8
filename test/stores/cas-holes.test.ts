import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createLocalProvider } from '../../providers/local';
import { sandboxPaths } from '../../providers/sandbox-state';
import { dataRuns, HOLE_BLOCK } from '../../stores/zeros';
import { context, manifest, mountsUnder, s3StoreFromEnv, sha256File, tempDir, uniqueId } from '../providers/helpers';
import { describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// A sparse file (its size far above the disk it takes) must come back from the store taking about
// the disk it took: a restore that wrote its zeros out filled the sandbox's volume (the resume never
// answered) or, without volumes, made the restoring host write up to a checkpoint's limit.

const store = s3StoreFromEnv();
const MiB = 1024 * 1024;

/** A piece of a file: data (random bytes, or one non-zero byte among zeros), zeros written out, or a hole. */
type Piece = { kind: 'data'; bytes: Buffer } | { kind: 'zeros'; length: number } | { kind: 'hole'; length: number };

/** Writes `pieces` one after the other to a new file (holes skipped, the length set at the end); returns its size. */
async function writePieces(file: string, pieces: Piece[]): Promise<number> {
  const handle = await fs.open(file, 'wx');
  try {
    let at = 0;
    for (const piece of pieces) {
      if (piece.kind === 'data') await handle.write(piece.bytes, 0, piece.bytes.length, at);
      if (piece.kind === 'zeros') await handle.write(Buffer.alloc(piece.length), 0, piece.length, at);
      at += piece.kind === 'data' ? piece.bytes.length : piece.length;
    }
    await handle.truncate(at);
    return at;
  } finally {
    await handle.close();
  }
}

/** Bytes of disk a file takes (st_blocks is in 512-byte units). */
const diskBytes = async (file: string) => (await fs.stat(file)).blocks * 512;

/** `length` bytes of noise from `seed` (xorshift32): random-looking data a failing case reproduces. */
function noise(length: number, seed: number): Buffer {
  const bytes = Buffer.alloc(length);
  let x = seed | 0 || 1;
  for (let i = 0; i < length; i += 1) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    bytes[i] = x & 0xff;
  }
  return bytes;
}

const piece: fc.Arbitrary<Piece> = fc.oneof(
  fc
    .tuple(fc.integer({ min: 1, max: 64 * 1024 }), fc.integer({ min: 1 }))
    .map(([length, seed]) => ({ kind: 'data' as const, bytes: noise(length, seed) })),
  // One byte of data in a stretch of zeros: its chunk holds far more zeros than data.
  fc
    .tuple(fc.integer({ min: 1, max: 3 * HOLE_BLOCK }), fc.nat(), fc.integer({ min: 1, max: 255 }))
    .map(([length, at, byte]) => {
      const bytes = Buffer.alloc(length);
      bytes[at % length] = byte;
      return { kind: 'data' as const, bytes };
    }),
  fc.integer({ min: 1, max: 256 * 1024 }).map((length) => ({ kind: 'zeros' as const, length })),
  fc.integer({ min: 1, max: 9 * MiB }).map((length) => ({ kind: 'hole' as const, length })),
);

test('property: the runs a restore writes are all that is not zero, and no block of them is all zeros', () => {
  const buffer = fc
    .array(
      fc.oneof(
        fc.uint8Array({ minLength: 1, maxLength: 3 * HOLE_BLOCK }),
        fc.integer({ min: 1, max: 3 * HOLE_BLOCK }).map((n) => new Uint8Array(n)),
        fc.tuple(fc.integer({ min: 1, max: 3 * HOLE_BLOCK }), fc.nat()).map(([n, at]) => {
          const bytes = new Uint8Array(n);
          bytes[at % n] = 1;
          return bytes;
        }),
      ),
      { maxLength: 8 },
    )
    .map((parts) => Buffer.concat(parts));
  fc.assert(
    fc.property(buffer, fc.nat({ max: 3 * HOLE_BLOCK }), (bytes, position) => {
      const runs = dataRuns(bytes, position);
      const rebuilt = Buffer.alloc(bytes.length);
      let last = -1;
      for (const [start, end] of runs) {
        // In order, apart (adjacent runs would be one), inside the bytes, not empty.
        expect(start).toBeGreaterThan(last);
        expect(end).toBeGreaterThan(start);
        expect(end).toBeLessThanOrEqual(bytes.length);
        last = end;
        bytes.copy(rebuilt, start, start, end);
        // Each piece of a run between the file's block boundaries has a byte that is not zero.
        for (let at = start; at < end;) {
          const next = Math.min(end, at + HOLE_BLOCK - ((position + at) % HOLE_BLOCK));
          expect(bytes.subarray(at, next).some((b) => b !== 0)).toBe(true);
          at = next;
        }
      }
      expect(rebuilt.equals(bytes)).toBe(true);
    }),
    { numRuns: 500 },
  );
});

test('property: files of data, zeros and holes restore from the store byte for byte, taking no more disk than they took', async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(fc.array(piece, { maxLength: 6 }), { minLength: 1, maxLength: 3 }), async (files) => {
      const root = await newSandboxRoot();
      const took: number[] = [];
      for (const [i, pieces] of files.entries()) {
        const file = path.join(root, 'workspace', `f${i}`);
        await writePieces(file, pieces);
        took.push(await diskBytes(file));
      }
      const { checkpoint } = await take(store, root, uniqueId('holes'));
      const { target } = await restoreFresh(store, checkpoint);
      expect(await describeTree(target)).toEqual(await describeTree(root));
      for (const [i, before] of took.entries()) {
        // No more than the original took, but for a block or two of the filesystem's own (extent tree blocks).
        expect(await diskBytes(path.join(target, 'workspace', `f${i}`))).toBeLessThanOrEqual(before + 2 * HOLE_BLOCK);
      }
      await fs.rm(root, { recursive: true, force: true });
      await fs.rm(target, { recursive: true, force: true });
    }),
    { numRuns: 12 },
  );
}, 300_000);

test('sparse files far larger than a sandbox volume restore onto it through the provider: a 200 MiB hole and a byte every MiB', async () => {
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('holes-vol');
  const big = path.join(root, 'workspace', 'big');
  await writePieces(big, [{ kind: 'hole', length: 200 * MiB }]);
  // Each of its chunks (4 MiB at most) holds bytes of data: none is all zeros, its blocks of zeros are.
  const dotted = path.join(root, 'workspace', 'dotted');
  await writePieces(
    dotted,
    Array.from({ length: 64 }, (_, i): Piece[] => [
      { kind: 'data', bytes: Buffer.from([i + 1]) },
      { kind: 'hole', length: MiB - 1 },
    ]).flat(),
  );
  await fs.writeFile(path.join(root, 'home', 'keep.txt'), 'keep');
  const { checkpoint } = await take(store, root, sandboxId);
  const dataDir = await tempDir('holes-host');
  const hostId = uniqueId('host');
  const provider = createLocalProvider({ hostId, dataDir, store, volumes: 'required' });
  const ctx = context({ hostId, ownerId: sandboxId });
  // A 16 MiB volume: the files' sizes are 264 MiB, their data a few KiB.
  await provider.restore({ sandboxId, fence: 2, checkpoint, limits: { diskMiB: 16 } }, ctx);
  try {
    const paths = sandboxPaths(dataDir, sandboxId);
    for (const [name, original] of [
      ['big', big],
      ['dotted', dotted],
    ]) {
      const restored = path.join(paths.workspace, name);
      expect((await fs.stat(restored)).size).toBe((await fs.stat(original)).size);
      expect(await sha256File(restored)).toBe(await sha256File(original));
      expect(await diskBytes(restored)).toBeLessThanOrEqual((await diskBytes(original)) + 2 * HOLE_BLOCK);
    }
    expect(await fs.readFile(path.join(paths.home, 'keep.txt'), 'utf8')).toBe('keep');
  } finally {
    await provider.destroy({ sandboxId, fence: 3 }, ctx);
  }
  expect(mountsUnder(dataDir)).toEqual([]);
}, 180_000);

test('an active workspace filled from the store onto another filesystem than the volume (copied, not renamed) keeps its holes, modes, times and links', async () => {
  const root = await newSandboxRoot();
  const sandboxId = uniqueId('holes-active');
  const workspace = path.join(root, 'workspace');
  await writePieces(path.join(workspace, 'sparse'), [
    { kind: 'data', bytes: Buffer.from('head') },
    { kind: 'hole', length: 100 * MiB },
  ]);
  await fs.mkdir(path.join(workspace, 'dir'), { mode: 0o750 });
  await fs.writeFile(path.join(workspace, 'dir', 'run.sh'), 'echo hi\n', { mode: 0o755 });
  await fs.utimes(path.join(workspace, 'dir', 'run.sh'), 1_000_000_000, 1_000_000_000);
  await fs.symlink('../outside', path.join(workspace, 'dir', 'link'));
  const { checkpoint } = await take(store, root, sandboxId);
  const dataDir = await tempDir('holes-active-host');
  // On the temporary directory's filesystem: the volume is another, so the restore copies the workspace.
  const hostPath = path.join(await tempDir('holes-active-ws'), 'ws');
  const hostId = uniqueId('host');
  const provider = createLocalProvider({ hostId, dataDir, store, volumes: 'required' });
  const ctx = context({ hostId, ownerId: sandboxId });
  await provider.restore({ sandboxId, fence: 2, checkpoint, workspace: { kind: 'active', hostPath } }, ctx);
  try {
    expect(await manifest(hostPath)).toEqual(await manifest(workspace));
    expect(await diskBytes(path.join(hostPath, 'sparse'))).toBeLessThanOrEqual(
      (await diskBytes(path.join(workspace, 'sparse'))) + 2 * HOLE_BLOCK,
    );
  } finally {
    await provider.destroy({ sandboxId, fence: 3 }, ctx);
  }
}, 180_000);
