import { uploadSnapshot } from '../../providers/snapshot';
import { sandboxPaths } from '../../providers/sandbox-state';
import { DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import type { CheckpointStore } from '../../stores/api';
import { PACK_SUFFIX } from '../../stores/cas/manifest';
import { S3CheckpointStore } from '../../stores/s3';
import { startS3Proxy } from '../faults/s3-proxy';
import { passThrough } from '../helpers/store-wrap';

// The worker of cas-snapshot's kill test, in a process of its own: it uploads a
// checkpoint through a fault proxy (in this process) that cuts the second pack's
// PutObject after KILL_AFTER_BYTES of its body, and SIGKILLs itself once another
// pack is stored, after printing the cut pack's key.

const [dataDir, sandboxId, fence, idempotencyKey] = process.argv.slice(2);
const KILL_AFTER_BYTES = 6 * 1024 * 1024;
const bucket = process.env.STASIS_S3_BUCKET ?? 'stasis';

let packsStored: () => void;
const packStored = new Promise<void>((resolve) => (packsStored = resolve));

async function main(): Promise<void> {
  const proxy = await startS3Proxy(process.env.STASIS_S3_ENDPOINT ?? '');
  let packPuts = 0;
  proxy.hold = ({ method, path }) => {
    const key = decodeURIComponent(path.split('?')[0]).replace(`/${bucket}/`, '');
    if (method !== 'PUT' || !key.endsWith(PACK_SUFFIX) || ++packPuts !== 2) return undefined;
    return {
      afterBytes: KILL_AFTER_BYTES,
      // The head of the body is on the wire; once another pack is stored, the process dies as a killed worker does.
      onHeld: () =>
        void packStored.then(() =>
          process.stdout.write(`KILLED-IN ${key}\n`, () => setTimeout(() => process.kill(process.pid, 'SIGKILL'), 500)),
        ),
    };
  };
  const inner = new S3CheckpointStore({
    endpoint: proxy.url,
    bucket,
    region: process.env.STASIS_S3_REGION ?? 'us-east-1',
    credentials: {
      accessKeyId: process.env.AWS_ACCESS_KEY_ID ?? '',
      secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY ?? '',
    },
  });
  const store: CheckpointStore = {
    ...passThrough(inner),
    putBytes: async (key, bytes, labels, signal) => {
      const stored = await inner.putBytes(key, bytes, labels, signal);
      if (key.endsWith(PACK_SUFFIX)) packsStored();
      return stored;
    },
  };
  await uploadSnapshot({
    store,
    paths: sandboxPaths(dataDir, sandboxId),
    sandboxId,
    fence: Number(fence),
    idempotencyKey,
    labels: {},
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { phase: '', bytes: 0 },
  });
}

main().then(
  () => process.stdout.write('FINISHED\n', () => process.exit(0)),
  (err: unknown) => {
    process.stderr.write(`${String(err)}\n`);
    process.exit(1);
  },
);
