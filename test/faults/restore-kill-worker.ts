// A worker host restoring one checkpoint from S3, in its own process, for the
// restore SIGKILL test (test/faults/restore-kill.test.ts). Run with
//   node -r scripts/register-ts.js test/faults/restore-kill-worker.ts
// and the S3 settings of the jest global setup, plus:
//   RK_DATA_DIR, RK_HOST_ID  the host (its own data dir and id: another host than the one that released)
//   RK_REQUEST               a JSON restore request {sandboxId, fence, checkpoint, workspace?}
//   RK_POINT                 where to stop: restore:mid-download | restore:mid-extract | restore:between-swap-renames |
//                            resume:after-start (compute started, the call not returned); unset: run to the end
//   RK_MARKER                the file written when the process has stopped at RK_POINT
// At the point the whole process freezes (Atomics.wait) until the test SIGKILLs it,
// so the files stay exactly as they were at that instant. The points sit inside
// the real restore: this process watches its own file system calls, the product
// code is unchanged.
import * as diagnostics from 'node:diagnostics_channel';
import nodeFs from 'node:fs';
import * as path from 'node:path';
import type { Writable } from 'node:stream';
import type { RestorePoint, ResumePoint } from './kill-points';

// The modules themselves (not copies), patched before the product code is loaded.
const fsSync = nodeFs;
const fs = nodeFs.promises;

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`restore-kill-worker: ${name} is not set`);
  return value;
};

const point = process.env.RK_POINT as RestorePoint | ResumePoint | undefined;

function freeze(): never {
  fsSync.writeFileSync(env('RK_MARKER'), String(process.pid));
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
  throw new Error('unreachable');
}

// A tar.gz checkpoint's archive, or a pack of a content-addressed one.
const isDownload = (file: string) => /\/\.restore-[0-9a-f]+\.(tar\.gz|pack-[0-9]+)$/.test(file);
const isStaged = (file: string) => /\/\.restore-[0-9a-f]+\/workspace\//.test(file);

if (point === 'restore:mid-download') {
  // The download has written some of its bytes, not all.
  const original = fsSync.createWriteStream;
  const patched = (file: nodeFs.PathLike, options?: Parameters<typeof original>[1]) => {
    const stream = original(file, options);
    if (!isDownload(String(file))) return stream;
    let bytes = 0;
    const write = stream._write.bind(stream);
    stream._write = (chunk: Buffer, encoding, callback) => {
      bytes += chunk.length;
      if (bytes > Number(env('RK_DOWNLOAD_BYTES'))) {
        return write(chunk, encoding, (err?: Error | null) => {
          if (!err) fsSync.fsyncSync((stream as unknown as { fd: number }).fd);
          freeze();
        });
      }
      return write(chunk, encoding, callback);
    };
    return stream as Writable as nodeFs.WriteStream;
  };
  (fsSync as { createWriteStream: unknown }).createWriteStream = patched;
}

if (point === 'restore:mid-extract') {
  // Some workspace files are unpacked into the staging directory, others not yet.
  const original = fs.open;
  let opened = 0;
  (fs as { open: unknown }).open = async (...args: Parameters<typeof original>) => {
    if (isStaged(String(args[0]))) {
      opened += 1;
      if (opened > Number(env('RK_EXTRACT_FILES'))) freeze();
    }
    return original(...args);
  };
  // Content-addressed restores create their files with synchronous calls (stores/cas/restore.ts).
  const originalSync = fsSync.openSync;
  (fsSync as { openSync: unknown }).openSync = (...args: Parameters<typeof originalSync>) => {
    if (isStaged(String(args[0]))) {
      opened += 1;
      if (opened > Number(env('RK_EXTRACT_FILES'))) freeze();
    }
    return originalSync(...args);
  };
}

if (point === 'restore:between-swap-renames') {
  // The old workspace has been moved aside; the restored one is not in its place yet.
  const original = fs.rename;
  (fs as { rename: unknown }).rename = async (...args: Parameters<typeof original>) => {
    await original(...args);
    if (/\/workspace\.old-[0-9a-f]+$/.test(String(args[1]))) freeze();
  };
}

if (point === 'resume:after-start') {
  // The sandbox's compute has started; the restore has not returned (its state may not record it yet).
  // The channel the restore marks its stages on (stores/cas/restore.ts), by name: the module is loaded later.
  diagnostics.subscribe('stasis:restore-stages', (message) => {
    if ((message as { stage: string }).stage === 'sandbox started and files ready') freeze();
  });
}

async function main(): Promise<void> {
  // Loaded only now, so that they see the patched file system calls.
  const { createLocalProvider } = await import('../../providers/local');
  const { S3CheckpointStore } = await import('../../stores/s3');
  const store = new S3CheckpointStore({
    bucket: env('STASIS_S3_BUCKET'),
    region: process.env.STASIS_S3_REGION ?? 'us-east-1',
    endpoint: env('STASIS_S3_ENDPOINT'),
    credentials: { accessKeyId: env('AWS_ACCESS_KEY_ID'), secretAccessKey: env('AWS_SECRET_ACCESS_KEY') },
  });
  const provider = createLocalProvider({ hostId: env('RK_HOST_ID'), dataDir: env('RK_DATA_DIR'), store });
  const result = await provider.restore(JSON.parse(env('RK_REQUEST')), {
    ownerId: 'restore-kill',
    hostId: env('RK_HOST_ID'),
  });
  process.stdout.write(`${JSON.stringify(result)}\n`);
  await fs.writeFile(path.join(env('RK_DATA_DIR'), 'restored.json'), JSON.stringify(result));
}

// The process starter the provider talks to does not keep a process alive (a worker's own work does): this does.
const alive = setInterval(() => undefined, 1_000);
main()
  .then(() => clearInterval(alive))
  .catch((err: unknown) => {
    process.stderr.write(`restore-kill-worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
