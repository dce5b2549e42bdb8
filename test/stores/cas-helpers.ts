import { createHash, randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { CheckpointStore } from '../../stores/api';
import { DEFAULT_ARCHIVE_LIMITS, type ArchiveLimits } from '../../stores/archive';
import type { Baseline } from '../../stores/cas/baseline';
import { restoreCheckpoint } from '../../stores/cas/restore';
import { takeCheckpoint } from '../../stores/cas/upload';
import type { S3CheckpointStore } from '../../stores/s3';
import { startS3Proxy, type FaultProxy } from '../faults/s3-proxy';
import { s3StoreFromEnv, tempDir, uniqueId } from '../providers/helpers';

// Helpers of the content-addressed checkpoint tests: take and restore a tree,
// and describe a tree (content, type, mode, mtime, link target) to compare two.

export const NAMES = ['workspace', 'home', 'envs'] as const;

export async function take(
  store: CheckpointStore,
  root: string,
  sandboxId: string,
  baseline?: Baseline,
  /** Where its packs are compressed (takeCheckpoint's tempPrefix). */
  tempPrefix?: string,
) {
  return takeCheckpoint({
    store,
    rootDir: root,
    names: NAMES,
    prefix: `checkpoints/${sandboxId}/`,
    name: uniqueId('t'),
    labels: { run: 'r1' },
    limits: DEFAULT_ARCHIVE_LIMITS,
    ...(baseline ? { baseline } : {}),
    progress: { bytes: 0 },
    ...(tempPrefix ? { tempPrefix } : {}),
  });
}

/** Restores the checkpoint into `target` (a new temporary directory by default), staged beside it, under `limits`. */
export async function restoreFresh(
  store: CheckpointStore,
  checkpoint: Awaited<ReturnType<typeof take>>['checkpoint'],
  target?: string,
  limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
) {
  target ??= await tempDir('cas-restore');
  const restored = await restoreCheckpoint({
    store,
    checkpoint,
    targetDir: target,
    tempPrefix: `${target}.tmp`,
    limits,
    progress: { bytes: 0 },
  });
  return { target, ...restored };
}

/** path → what a restore must reproduce (setuid/setgid stripped, mtimes to the microsecond, or to `mtimeUnitNs`). */
export async function describeTree(root: string, mtimeUnitNs = 1000n): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const name of NAMES) {
    const top = path.join(root, name);
    const stat = await fs.lstat(top).catch(() => undefined);
    if (!stat) continue;
    for (const relative of ['', ...(await fs.readdir(top, { recursive: true })).map(String)]) {
      const file = path.join(top, relative);
      const s = await fs.lstat(file, { bigint: true });
      const mode = (Number(s.mode) & 0o7777 & 0o1777).toString(8);
      const mtime = (s.mtimeNs / mtimeUnitNs).toString();
      let what: string;
      if (s.isSymbolicLink()) what = `link ${await fs.readlink(file)}`;
      else if (s.isDirectory()) what = `dir ${mode} ${mtime}`;
      else
        what = `file ${mode} ${mtime} ${createHash('sha256')
          .update(await fs.readFile(file))
          .digest('hex')}`;
      out[path.posix.join(name, relative.split(path.sep).join('/'))] = what;
    }
  }
  return out;
}

export async function newSandboxRoot(): Promise<string> {
  const root = await tempDir('cas-src');
  for (const name of NAMES) await fs.mkdir(path.join(root, name));
  return root;
}

export function bytes(size: number): Buffer {
  return randomBytes(size);
}

/** Every path under `root`, relative, sorted; a symlink is listed but never followed (`readdir`'s `recursive` follows them). */
export async function listNoFollow(root: string): Promise<string[]> {
  const out: string[] = [];
  const visit = async (relative: string): Promise<void> => {
    for (const entry of await fs.readdir(path.join(root, relative), { withFileTypes: true })) {
      const child = relative ? path.join(relative, entry.name) : entry.name;
      out.push(child);
      if (entry.isDirectory()) await visit(child);
    }
  };
  await visit('');
  return out.sort();
}

/** Runs `fn` with a fault proxy in front of the test MinIO and the store reached through it; closes the proxy after. */
export async function behindProxy(
  fn: (proxy: FaultProxy, store: S3CheckpointStore) => Promise<void>,
  partSize?: number,
): Promise<void> {
  const proxy = await startS3Proxy(process.env.STASIS_S3_ENDPOINT ?? '');
  try {
    await fn(proxy, s3StoreFromEnv(partSize, proxy.url));
  } finally {
    await proxy.close();
  }
}
