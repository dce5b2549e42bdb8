import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { scanSandboxProcesses } from '../providers/processes';
import { sandboxesDir } from '../providers/sandbox-state';
import { HOST_ID, type BenchEnv } from './env';

// What a phase left behind on the worker's host: sandbox processes (found by
// their marker environment, whatever their process group), sandbox directories,
// and checkpoint objects in the store.

export interface Leftovers {
  processes: number;
  /** Sandbox directories of the worker's host (each destroyed Run removes its own). */
  workspaces: number;
  /** Objects under checkpoints/ in the bucket. */
  checkpointObjects: number;
}

export async function sandboxProcessCount(hostId = HOST_ID): Promise<number> {
  let n = 0;
  for (const list of (await scanSandboxProcesses(hostId)).values()) n += list.length;
  return n;
}

export async function leftovers(env: BenchEnv): Promise<Leftovers> {
  // The worker's own host id: a profile script runs on one of its own, beside the bench's.
  const hostId = env.config.STASIS_HOST_ID;
  const dir = sandboxesDir(path.join(env.config.STASIS_DATA_DIR, 'hosts', hostId));
  const workspaces = (await fs.readdir(dir).catch(() => [] as string[])).length;
  return { processes: await sandboxProcessCount(hostId), workspaces, checkpointObjects: await countCheckpoints(env) };
}

async function countCheckpoints(env: BenchEnv): Promise<number> {
  const { minio } = env;
  const s3 = new S3Client({
    endpoint: minio.endpoint,
    region: minio.region,
    forcePathStyle: true,
    ...(minio.accessKeyId && minio.secretAccessKey
      ? { credentials: { accessKeyId: minio.accessKeyId, secretAccessKey: minio.secretAccessKey } }
      : {}),
  });
  try {
    let count = 0;
    let token: string | undefined;
    do {
      const page = await s3.send(
        new ListObjectsV2Command({ Bucket: minio.bucket, Prefix: 'checkpoints/', ContinuationToken: token }),
      );
      count += page.KeyCount ?? 0;
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return count;
  } finally {
    s3.destroy();
  }
}

/** Kills what sandbox processes of `hosts` are still alive (a Run the bench could not finish); returns how many. */
export async function killSandboxProcesses(hosts: string[]): Promise<number> {
  let killed = 0;
  for (const host of hosts) {
    for (const list of (await scanSandboxProcesses(host)).values()) {
      for (const { pid } of list) {
        try {
          process.kill(pid, 'SIGKILL');
          killed += 1;
        } catch {
          // already gone
        }
      }
    }
  }
  return killed;
}
