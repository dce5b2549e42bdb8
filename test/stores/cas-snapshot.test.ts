import { ListMultipartUploadsCommand } from '@aws-sdk/client-s3';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { restoreSnapshot, uploadSnapshot, type CheckpointFormat } from '../../providers/snapshot';
import { sandboxPaths } from '../../providers/sandbox-state';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { RACY_MARGIN_NS } from '../../stores/cas/baseline';
import { decodeTopObject, isManifestUri, PACK_SUFFIX } from '../../stores/cas/manifest';
import { testS3 } from '../helpers/s3';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree } from './cas-helpers';

// Checkpoints through the provider's snapshot functions, from the store (MinIO) onto
// another host's directory: tar.gz checkpoints of earlier versions still restore,
// and a suspend right after a resume on the other host uploads no file data.

const store = s3StoreFromEnv(5 * 1024 * 1024);

async function sandbox(id: string, dataDir?: string) {
  const paths = sandboxPaths(dataDir ?? (await tempDir('cas-host')), id);
  for (const dir of [paths.workspace, paths.home, paths.envs, paths.meta]) await fs.mkdir(dir, { recursive: true });
  return paths;
}

function upload(paths: Awaited<ReturnType<typeof sandbox>>, id: string, fence: number, format?: CheckpointFormat) {
  const progress = { phase: '', bytes: 0 };
  return uploadSnapshot({
    store,
    paths,
    sandboxId: id,
    fence,
    idempotencyKey: `k-${fence}`,
    labels: { run: 'r' },
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress,
    ...(format ? { format } : {}),
  }).then((checkpoint) => ({ checkpoint, uploaded: progress.bytes }));
}

async function restore(
  paths: Awaited<ReturnType<typeof sandbox>>,
  checkpoint: { uri: string; sha256: string; bytes: number },
) {
  const { labels, ready } = await restoreSnapshot({
    store,
    checkpoint,
    paths,
    workspace: { kind: 'isolated' },
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { phase: '', bytes: 0 },
    beforeSwap: async () => undefined,
  });
  await ready;
  return labels;
}

async function populate(root: string): Promise<void> {
  await fs.mkdir(path.join(root, 'workspace', 'src'), { recursive: true });
  for (let i = 0; i < 30; i += 1) await fs.writeFile(path.join(root, 'workspace', 'src', `m${i}.py`), bytes(2000 + i));
  await fs.writeFile(path.join(root, 'workspace', 'data.bin'), bytes(3 * 1024 * 1024));
  await fs.mkdir(path.join(root, 'envs', 'venv', 'bin'), { recursive: true });
  await fs.symlink('/usr/bin/python3', path.join(root, 'envs', 'venv', 'bin', 'python'));
  await fs.writeFile(path.join(root, 'home', '.bashrc'), 'echo hi\n');
}

test('a tar.gz checkpoint of an earlier version restores on another host', async () => {
  const id = uniqueId('compat');
  const a = await sandbox(id);
  await populate(a.volume);
  const { checkpoint } = await upload(a, id, 2, 'tar');
  expect(checkpoint.uri).toMatch(/\.tar\.gz$/);
  const b = await sandbox(id);
  expect(await restore(b, checkpoint)).toEqual({ run: 'r' });
  // The tar.gz format keeps whole seconds.
  expect(await describeTree(b.volume, 1_000_000_000n)).toEqual(await describeTree(a.volume, 1_000_000_000n));
  await store.deletePrefix(`checkpoints/${id}/`);
});

test('resumed on another host from the store, the next suspend uploads no file data, and a change uploads only itself', async () => {
  const id = uniqueId('resume');
  const a = await sandbox(id);
  await populate(a.volume);
  const first = await upload(a, id, 2);
  expect(first.checkpoint.uri).toMatch(/\.manifest\.gz$/);
  expect(first.uploaded).toBeGreaterThan(3 * 1024 * 1024);
  const b = await sandbox(id);
  await restore(b, first.checkpoint);
  expect(await describeTree(b.volume)).toEqual(await describeTree(a.volume));
  expect(Object.keys(await describeTree(b.volume)).length).toBeGreaterThan(30);
  const packsBefore = (await store.list(`checkpoints/${id}/packs/`)).length;
  const segmentsBefore = (await store.list(`checkpoints/${id}/segments/`)).length;
  const again = await upload(b, id, 3);
  // The top object is all that goes out (progress counts packs and segments): nothing in a segment is a host's.
  expect(again.uploaded).toBe(0);
  expect((await store.list(`checkpoints/${id}/packs/`)).length).toBe(packsBefore);
  expect((await store.list(`checkpoints/${id}/segments/`)).length).toBe(segmentsBefore);
  const unchanged = await upload(b, id, 4);
  expect(unchanged.uploaded).toBe(0);
  await fs.writeFile(path.join(b.volume, 'workspace', 'src', 'm3.py'), bytes(2500));
  const changed = await upload(b, id, 5);
  expect(changed.uploaded).toBeGreaterThan(2500);
  // The file (2.5 KB of random bytes) and the one segment of the manifest holding its entry (~35 entries).
  expect(changed.uploaded).toBeLessThan(2500 + 8 * 1024);
  const c = await sandbox(id);
  await restore(c, changed.checkpoint);
  expect(await describeTree(c.volume)).toEqual(await describeTree(b.volume));
  await store.deletePrefix(`checkpoints/${id}/`);
});

/** The pack uris every manifest in the sandbox's prefix names. */
async function namedPacks(id: string): Promise<Set<string>> {
  const named = new Set<string>();
  for (const object of await store.list(`checkpoints/${id}/`)) {
    if (!isManifestUri(object.uri)) continue;
    const json = await decodeTopObject(await store.read(object.uri, 1 << 26), object.uri, 1 << 28);
    for (const pack of (JSON.parse(json.toString()) as { packs: { uri: string }[] }).packs) named.add(pack.uri);
  }
  return named;
}

test('a worker killed in the middle of a pack upload: the retry completes, and no pack is left that no manifest names', async () => {
  const id = uniqueId('killed');
  const dataDir = await tempDir('cas-kill');
  const a = await sandbox(id, dataDir);
  await populate(a.volume);
  // Three packs of incompressible data, each larger than where the kill cuts a pack's PutObject.
  const big = path.join(a.volume, 'workspace', 'big.bin');
  await fs.writeFile(big, bytes(24 * 1024 * 1024));
  const child = spawn(
    process.execPath,
    [
      '-r',
      path.join(__dirname, '..', '..', 'scripts', 'register-ts.js'),
      path.join(__dirname, 'cas-kill-upload.ts'),
      dataDir,
      id,
      '2',
      'k-2',
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const signal = await new Promise((resolve) => child.on('exit', (_code, sig) => resolve(sig)));
  expect({ signal, output }).toMatchObject({ signal: 'SIGKILL', output: expect.stringContaining('KILLED-IN') });
  const killedKey = /KILLED-IN (\S+)/.exec(output)![1];
  const s3 = testS3();
  const openUploads = async () =>
    (
      (
        await s3.send(
          new ListMultipartUploadsCommand({ Bucket: process.env.STASIS_S3_BUCKET ?? 'stasis', Prefix: killedKey }),
        )
      ).Uploads ?? []
    ).filter((u) => u.Key === killedKey).length;
  const packsStored = async () =>
    (await store.list(`checkpoints/${id}/packs/`)).filter((o) => o.key.endsWith(PACK_SUFFIX)).map((o) => o.uri);
  // What a killed attempt leaves: finished packs no manifest names (others uploading beside it may finish); of the
  // pack whose PutObject was cut part-way nothing at all (no object, no multipart upload: putBytes starts none).
  const left = await packsStored();
  expect(left.length).toBeGreaterThan(0);
  expect(await store.exists(`s3://${process.env.STASIS_S3_BUCKET ?? 'stasis'}/${killedKey}`)).toBe(false);
  expect(await openUploads()).toBe(0);
  expect(await namedPacks(id)).toEqual(new Set());
  // Meanwhile the file's first bytes changed: its first chunk, and the first pack's name with it, differ on the retry.
  const handle = await fs.open(big, 'r+');
  await handle.write(Buffer.from('changed before the retry'), 0, undefined, 0);
  await handle.close();
  await delay(Number(RACY_MARGIN_NS / 1_000_000n) + 10);

  const retried = await upload(a, id, 2);
  expect(retried.checkpoint.uri).toMatch(/\.manifest\.gz$/);
  // Every pack left in the store is one the checkpoint names: the killed attempt's went to garbage collection or was rewritten.
  const named = await namedPacks(id);
  expect(new Set(await packsStored())).toEqual(named);
  // The first pack the killed attempt finished is named no more: this retry did not merely rewrite it.
  expect(left.filter((uri) => !named.has(uri)).length).toBeGreaterThan(0);
  expect(await openUploads()).toBe(0);
  const b = await sandbox(id);
  await restore(b, retried.checkpoint);
  expect(await describeTree(b.volume)).toEqual(await describeTree(a.volume));
  s3.destroy();
  await store.deletePrefix(`checkpoints/${id}/`);
}, 120_000);
