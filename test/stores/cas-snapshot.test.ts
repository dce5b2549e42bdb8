import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { restoreSnapshot, uploadSnapshot, type CheckpointFormat } from '../../providers/snapshot';
import { sandboxPaths } from '../../providers/sandbox-state';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { RACY_MARGIN_NS } from '../../stores/cas/baseline';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';
import { bytes, describeTree } from './cas-helpers';

// Checkpoints through the provider's snapshot functions, from the store (MinIO) onto
// another host's directory: tar.gz checkpoints of earlier versions still restore,
// and a suspend right after a resume on the other host uploads no file data.

const store = s3StoreFromEnv(5 * 1024 * 1024);

async function sandbox(id: string) {
  const paths = sandboxPaths(await tempDir('cas-host'), id);
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

function restore(
  paths: Awaited<ReturnType<typeof sandbox>>,
  checkpoint: { uri: string; sha256: string; bytes: number },
) {
  return restoreSnapshot({
    store,
    checkpoint,
    paths,
    workspace: { kind: 'isolated' },
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { phase: '', bytes: 0 },
    beforeSwap: async () => undefined,
  });
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
  expect(first.checkpoint.uri).toMatch(/\.manifest\.zst$/);
  expect(first.uploaded).toBeGreaterThan(3 * 1024 * 1024);
  const b = await sandbox(id);
  await restore(b, first.checkpoint);
  expect(await describeTree(b.volume)).toEqual(await describeTree(a.volume));
  expect(Object.keys(await describeTree(b.volume)).length).toBeGreaterThan(30);
  await delay(Number(RACY_MARGIN_NS / 1_000_000n) + 10);
  const again = await upload(b, id, 3);
  // The manifest is all that goes out.
  expect(again.uploaded).toBe(0);
  await fs.writeFile(path.join(b.volume, 'workspace', 'src', 'm3.py'), bytes(2500));
  const changed = await upload(b, id, 4);
  expect(changed.uploaded).toBeGreaterThan(2500);
  expect(changed.uploaded).toBeLessThan(3000);
  const c = await sandbox(id);
  await restore(c, changed.checkpoint);
  expect(await describeTree(c.volume)).toEqual(await describeTree(b.volume));
  await store.deletePrefix(`checkpoints/${id}/`);
});
