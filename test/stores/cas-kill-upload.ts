import { Transform, type Readable } from 'node:stream';
import { uploadSnapshot } from '../../providers/snapshot';
import { sandboxPaths } from '../../providers/sandbox-state';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import type { CheckpointStore } from '../../stores/api';
import { passThrough } from '../helpers/store-wrap';
import { s3StoreFromEnv } from '../providers/helpers';

// The worker of cas-snapshot's kill test, in a process of its own: it uploads a
// checkpoint and SIGKILLs itself once the second pack's multipart upload has sent
// its first part, after printing that pack's key.

const [dataDir, sandboxId, fence, idempotencyKey] = process.argv.slice(2);
const KILL_AFTER_BYTES = 6 * 1024 * 1024;

const inner = s3StoreFromEnv(5 * 1024 * 1024);
let packs = 0;
let firstPackDone: () => void;
const firstPack = new Promise<void>((resolve) => (firstPackDone = resolve));
const store: CheckpointStore = {
  ...passThrough(inner),
  put(key: string, body: Readable, labels: Record<string, string>, signal?: AbortSignal) {
    if (!key.includes('/packs/')) return inner.put(key, body, labels, signal);
    if (++packs < 2) return inner.put(key, body, labels, signal).finally(() => firstPackDone());
    let bytes = 0;
    const gate = new Transform({
      transform(chunk: Buffer, _encoding, callback) {
        const before = bytes;
        bytes += chunk.length;
        if (bytes <= KILL_AFTER_BYTES) {
          callback(null, chunk);
          return;
        }
        // The first 5 MiB part is on its way: the upload is fed no further; once the first pack is stored,
        // and the part had time to arrive, the process dies as a killed worker does.
        if (before <= KILL_AFTER_BYTES) {
          this.push(chunk.subarray(0, KILL_AFTER_BYTES - before + 1));
          void firstPack.then(() =>
            process.stdout.write(`KILLED-IN ${key}\n`, () =>
              setTimeout(() => process.kill(process.pid, 'SIGKILL'), 500),
            ),
          );
        }
      },
    });
    body.on('error', (err) => gate.destroy(err));
    return inner.put(key, body.pipe(gate), labels, signal);
  },
};

uploadSnapshot({
  store,
  paths: sandboxPaths(dataDir, sandboxId),
  sandboxId,
  fence: Number(fence),
  idempotencyKey,
  labels: {},
  limits: DEFAULT_ARCHIVE_LIMITS,
  progress: { phase: '', bytes: 0 },
}).then(
  () => process.stdout.write('FINISHED\n', () => process.exit(0)),
  (err: unknown) => {
    process.stderr.write(`${String(err)}\n`);
    process.exit(1);
  },
);
