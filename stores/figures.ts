import { GetObjectCommand, paginateListObjectsV2, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { z } from 'zod';
import type { Config } from '../common/config';
import { hasErrorCode, writeFileAtomic } from './atomic-file';

// Each host's own diagnostics (provider failures, retries, recent release
// latencies), kept where every host and every API process can read them: beside
// the checkpoints, under `metrics/<hostId>.json` in the S3 bucket (the fs store
// keeps them in the data dir, one machine's as the fs store is). A host writes
// only its own object, so hosts never race; a restarted host reads its figures
// back and counts on; a host that died leaves its last figures behind.

export const HostFigures = z.object({
  hostId: z.string(),
  failures: z.number().int().nonnegative(),
  retries: z.number().int().nonnegative(),
  /** Confirmed releases, all time. */
  releases: z.number().int().nonnegative(),
  /** The host's most recent release latencies (ms), oldest first. */
  releaseLatencyMs: z.array(z.number().nonnegative()),
  updatedAt: z.string(),
});
export type HostFigures = z.infer<typeof HostFigures>;

export interface FiguresStore {
  /** Replaces the host's figures. */
  write(figures: HostFigures): Promise<void>;
  /** One host's figures, if it ever wrote any. */
  read(hostId: string): Promise<HostFigures | undefined>;
  /** Every host's figures; unreadable entries are skipped. */
  readAll(): Promise<HostFigures[]>;
}

const PREFIX = 'metrics/';
const fileName = (hostId: string) => `${hostId}.json`;

function parse(text: string): HostFigures | undefined {
  try {
    const parsed = HostFigures.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

export class FsFiguresStore implements FiguresStore {
  constructor(private readonly dir: string) {}

  async write(figures: HostFigures): Promise<void> {
    await fs.mkdir(this.dir, { recursive: true });
    await writeFileAtomic(path.join(this.dir, fileName(figures.hostId)), JSON.stringify(figures));
  }

  async read(hostId: string): Promise<HostFigures | undefined> {
    try {
      return parse(await fs.readFile(path.join(this.dir, fileName(hostId)), 'utf8'));
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return undefined;
      throw err;
    }
  }

  async readAll(): Promise<HostFigures[]> {
    const names = await fs.readdir(this.dir).catch((err: unknown) => {
      if (hasErrorCode(err, 'ENOENT')) return [] as string[];
      throw err;
    });
    const all = await Promise.all(
      names
        .filter((n) => n.endsWith('.json'))
        .map((n) => this.read(n.slice(0, -'.json'.length)).catch(() => undefined)),
    );
    return all.filter((f): f is HostFigures => f !== undefined);
  }
}

export class S3FiguresStore implements FiguresStore {
  constructor(
    private readonly client: S3Client,
    private readonly bucket: string,
  ) {}

  async write(figures: HostFigures): Promise<void> {
    await this.client.send(
      new PutObjectCommand({
        Bucket: this.bucket,
        Key: PREFIX + fileName(figures.hostId),
        Body: JSON.stringify(figures),
        ContentType: 'application/json',
      }),
    );
  }

  async read(hostId: string): Promise<HostFigures | undefined> {
    return this.readKey(PREFIX + fileName(hostId));
  }

  private async readKey(key: string): Promise<HostFigures | undefined> {
    try {
      const out = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: key }));
      return parse((await out.Body?.transformToString()) ?? '');
    } catch (err) {
      if ((err as { name?: string }).name === 'NoSuchKey') return undefined;
      throw err;
    }
  }

  async readAll(): Promise<HostFigures[]> {
    const keys: string[] = [];
    for await (const page of paginateListObjectsV2({ client: this.client }, { Bucket: this.bucket, Prefix: PREFIX })) {
      for (const object of page.Contents ?? []) if (object.Key?.endsWith('.json')) keys.push(object.Key);
    }
    const all = await Promise.all(keys.map((key) => this.readKey(key).catch(() => undefined)));
    return all.filter((f): f is HostFigures => f !== undefined);
  }
}

/** The figures store beside the configured checkpoint store. */
export function createFiguresStore(config: Config): FiguresStore {
  if (config.snapshotStore === 'fs') return new FsFiguresStore(path.join(config.STASIS_DATA_DIR, 'metrics'));
  const { AWS_ACCESS_KEY_ID: accessKeyId, AWS_SECRET_ACCESS_KEY: secretAccessKey } = config;
  const client = new S3Client({
    region: config.STASIS_S3_REGION,
    ...(config.STASIS_S3_ENDPOINT ? { endpoint: config.STASIS_S3_ENDPOINT, forcePathStyle: true } : {}),
    ...(accessKeyId && secretAccessKey ? { credentials: { accessKeyId, secretAccessKey } } : {}),
    // A stalled store must fail the write in seconds (it is logged and retried with the next
    // change), so the writes queued behind it, and a worker's shutdown that waits for them, go on.
    maxAttempts: 2,
    requestHandler: { connectionTimeout: 5_000, socketTimeout: 10_000 },
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
  return new S3FiguresStore(client, config.STASIS_S3_BUCKET);
}
