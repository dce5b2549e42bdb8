import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { checkpointPrefix } from '../../providers/snapshot';
import { s3StoreFromEnv, stasisError, tempDir, uniqueId } from '../providers/helpers';

// A checkpoint's object may be written by anyone with access to the store (issue 16's threat: a top
// object forged in a sandbox's prefix naming packs there). A download is checked against the size
// its record declares; an object larger than that must be refused as soon as it passes that size,
// not written whole to the host's disk (a pack download lands in the sandbox root, outside its
// volume's quota) and refused after. Real MinIO; the file's size is watched while it downloads.

const store = s3StoreFromEnv(5 * 1024 * 1024);

test('an object larger than its record declares is refused before more than the declared bytes reach the disk', async () => {
  const declared = 1024 * 1024;
  const big = Buffer.alloc(48 * 1024 * 1024, 7);
  const key = `${checkpointPrefix(uniqueId('forged'))}packs/${'a'.repeat(64)}.pack`;
  const written = await store.putBytes(key, big, {});
  const dir = await tempDir('download-cap');
  const file = path.join(dir, 'pack');
  let largest = 0;
  let watching = true;
  const watcher = (async () => {
    while (watching) {
      const size = (await fs.stat(file).catch(() => undefined))?.size ?? 0;
      largest = Math.max(largest, size);
      await new Promise((resolve) => setImmediate(resolve));
    }
  })();
  try {
    await stasisError(store.download({ ...written, bytes: declared }, file), 'CHECKPOINT_INVALID');
  } finally {
    watching = false;
    await watcher;
  }
  // One read's worth past the declared size at most (the stream's chunks are 64 KiB to 1 MiB).
  expect(largest).toBeLessThanOrEqual(declared + 1024 * 1024);
  expect(await fs.readdir(dir)).toEqual([]);
  await store.delete(written.uri);
}, 120_000);
