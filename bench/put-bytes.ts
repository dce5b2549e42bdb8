// Checkpoint object puts on S3: `put` (ListMultipartUploads, then lib-storage Upload through a
// hashing stream) against `putBytes` (one PutObject), for the objects the content-addressed engine
// writes: 8 MiB packs (incompressible) and small manifest objects. Starts its own MinIO in a temp dir.
// Each `put` sends ListMultipartUploads before its PutObject; `putBytes` only the PutObject.
//   node -r scripts/register-ts.js bench/put-bytes.ts [rounds]
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import { freePorts, startMinio } from '../platform/servers';
import { S3CheckpointStore } from '../stores/s3';

type Way = 'put' | 'putBytes';

async function main(): Promise<void> {
  const rounds = Number(process.argv[2] ?? 15);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'put-bytes-'));
  const [port, consolePort] = await freePorts(2);
  // Our own MinIO, never one the environment names.
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.STASIS_S3_ENDPOINT;
  const minio = await startMinio({ dataDir, port, consolePort, env });
  try {
    const store = new S3CheckpointStore({
      bucket: minio.bucket,
      region: minio.region,
      endpoint: minio.endpoint,
      credentials: { accessKeyId: minio.accessKeyId ?? '', secretAccessKey: minio.secretAccessKey ?? '' },
    });
    const prefix = `checkpoints/put-bytes-${Date.now().toString(36)}/`;
    const packs = Array.from({ length: 4 }, () => randomBytes(8 * 1024 * 1024));
    const small = Array.from({ length: 8 }, () => randomBytes(25 * 1024));
    const one = (way: Way, key: string, bytes: Buffer) =>
      way === 'put' ? store.put(key, Readable.from([bytes]), {}) : store.putBytes(key, bytes, {});
    /** Milliseconds for the objects at once (as the engine puts packs: 4 in flight). */
    const timed = async (way: Way, objects: Buffer[], round: number) => {
      const started = process.hrtime.bigint();
      await Promise.all(objects.map((bytes, i) => one(way, `${prefix}${way}-${round}-${i}.pack`, bytes)));
      return Number(process.hrtime.bigint() - started) / 1e6;
    };
    const results: Record<string, number[]> = {};
    const record = (name: string, ms: number) => (results[name] ??= []).push(ms);
    for (let round = -2; round < rounds; round += 1) {
      // Alternating which goes first, so neither always meets a warmer store; two warm-up rounds.
      const order: Way[] = round % 2 === 0 ? ['put', 'putBytes'] : ['putBytes', 'put'];
      for (const way of order) {
        const packMs = await timed(way, packs, round);
        const smallMs = await timed(way, small, round + 1000);
        if (round >= 0) {
          record(`${way} 4 x 8 MiB packs`, packMs);
          record(`${way} 8 x 25 KiB objects`, smallMs);
        }
      }
    }
    await store.deletePrefix(prefix);
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    console.log(
      `rounds ${rounds}, load average ${os
        .loadavg()
        .map((l) => l.toFixed(2))
        .join(' ')}`,
    );
    for (const [name, ms] of Object.entries(results)) {
      const sorted = [...ms].sort((a, b) => a - b);
      console.log(
        `${name}: median ${median(ms).toFixed(1)} ms (min ${sorted[0].toFixed(1)}, max ${sorted.at(-1)!.toFixed(1)})`,
      );
    }
    for (const what of ['4 x 8 MiB packs', '8 x 25 KiB objects']) {
      const ratio = median(results[`putBytes ${what}`]) / median(results[`put ${what}`]);
      console.log(`putBytes / put, ${what}: ${ratio.toFixed(2)}`);
    }
  } finally {
    await minio.stop();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

void main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
