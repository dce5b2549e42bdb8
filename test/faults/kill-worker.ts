// A real Stasis worker in its own process, for the SIGKILL fault test
// (test/faults/worker-kill.test.ts). Run with
//   node -r scripts/register-ts.js test/faults/kill-worker.ts
// and the worker's usual environment (TEMPORAL_ADDRESS, STASIS_TASK_QUEUE,
// STASIS_DATA_DIR, STASIS_HOST_ID, the S3 settings), plus:
//   KILL_BUNDLE   a JSON file with the pre-built workflow bundle ({code, sourceMap})
//   KILL_PLAN     a JSON file {sandboxId: point}: where that sandbox's release or restore stops
//   KILL_MARKERS  a directory: `<sandboxId>@<point>` appears when a call has stopped there
//   KILL_LOG      a JSON-lines file of what the provider did (releases, with duplicate or not; restores)
//   KILL_PROVIDER `local` (default) or `bwrap`: whose sandboxes the provider makes
// The provider is the real `local` (or `bwrap`) provider under the name `killable`, the store
// the real S3 store, behind a fault proxy in this process (which cuts a planned pack's
// PutObject mid-body); at a planned point a call stops (keeping its activity alive
// with heartbeats) until the test kills this process. A point is stopped at once:
// after a restart the marker exists and the call goes through.
import { appendFileSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { DefaultLogger, Runtime, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { loadConfig } from '../../common/config';
import type { ProviderDeps, RequestContext, SandboxProvider } from '../../providers/api';
import { bubblewrapCommands } from '../../providers/bwrap';
import { createLocalProvider } from '../../providers/local';
import { S3CheckpointStore } from '../../stores/s3';
import type { CheckpointStore } from '../../stores/api';
import { MANIFEST_SUFFIX, PACK_SUFFIX } from '../../stores/cas/manifest';
import type { Checkpoint } from '../../common/schemas';
import { createStasisWorker } from '../../workers/worker';
import { passThrough } from '../helpers/store-wrap';
import { MID_UPLOAD_BYTES, PART_BYTES, type KillPoint } from './kill-points';
import { startS3Proxy, type FaultProxy } from './s3-proxy';

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`kill-worker: ${name} is not set`);
  return value;
};

const planFile = env('KILL_PLAN');
const markers = env('KILL_MARKERS');
const logFile = env('KILL_LOG');

function planned(sandboxId: string, point: KillPoint): boolean {
  const plan = JSON.parse(readFileSync(planFile, 'utf8')) as Record<string, KillPoint>;
  return plan[sandboxId] === point && !existsSync(path.join(markers, `${sandboxId}@${point}`));
}

function log(entry: Record<string, unknown>): void {
  appendFileSync(logFile, `${JSON.stringify({ at: Date.now(), pid: process.pid, ...entry })}\n`);
}

/** Stops here for good (until SIGKILL), telling the test, and keeping the activity alive. */
async function stopHere(sandboxId: string, point: KillPoint, context?: RequestContext, key?: string): Promise<never> {
  writeFileSync(path.join(markers, `${sandboxId}@${point}`), String(process.pid));
  log({ event: 'stopped', sandboxId, point, ...(key ? { key } : {}) });
  for (;;) {
    context?.heartbeat?.({ stoppedAt: point });
    await new Promise((resolve) => setTimeout(resolve, 1_000));
  }
}

const sandboxOfKey = (key: string): string => key.split('/')[1] ?? '';

function killableStore(inner: CheckpointStore): CheckpointStore {
  /** Logs a stored object; after the checkpoint object itself (not a pack or segment), stops if planned. */
  const uploaded = async (key: string, checkpoint: Checkpoint, whole: boolean) => {
    const sandboxId = sandboxOfKey(key);
    log({ event: 'uploaded', sandboxId, uri: checkpoint.uri });
    if (whole && planned(sandboxId, 'release:after-upload')) await stopHere(sandboxId, 'release:after-upload');
    return checkpoint;
  };
  return {
    ...passThrough(inner),
    // A tar.gz checkpoint: one streamed (multipart) upload, stopped here mid-body.
    async put(key: string, body: Readable, labels: Record<string, string>, signal?: AbortSignal) {
      const sandboxId = sandboxOfKey(key);
      let source: Readable = body;
      if (planned(sandboxId, 'release:mid-upload')) {
        let bytes = 0;
        const gate = new Transform({
          transform(chunk: Buffer, _encoding, callback) {
            // Feed the upload up to MID_UPLOAD_BYTES (more than one part, so a multipart upload is in
            // progress), then stop feeding it. A chunk may be large: pass its head on first.
            const room = MID_UPLOAD_BYTES - bytes;
            bytes += chunk.length;
            if (bytes <= MID_UPLOAD_BYTES) return callback(null, chunk);
            if (room > 0) this.push(chunk.subarray(0, room));
            void stopHere(sandboxId, 'release:mid-upload', undefined, key);
          },
        });
        body.on('error', (err) => gate.destroy(err));
        source = body.pipe(gate);
      }
      return uploaded(key, await inner.put(key, source, labels, signal), true);
    },
    // Packs, segments and the manifest of a content-addressed checkpoint: a pack's PutObject is cut
    // mid-body on the wire (holdPackPut), as a worker killed during it leaves it.
    putBytes: async (key, bytes, labels, signal) =>
      uploaded(key, await inner.putBytes(key, bytes, labels, signal), key.endsWith(MANIFEST_SUFFIX)),
  };
}

/**
 * For the fault proxy in front of the store: a planned sandbox's first pack PutObject larger than
 * MID_UPLOAD_BYTES sends that much of its body, and then nothing (until SIGKILL).
 */
function holdPackPut(bucket: string): NonNullable<FaultProxy['hold']> {
  const held = new Set<string>();
  return ({ method, path: urlPath, contentLength }) => {
    const key = decodeURIComponent(urlPath.split('?')[0]).replace(`/${bucket}/`, '');
    const sandboxId = sandboxOfKey(key);
    if (method !== 'PUT' || !key.endsWith(PACK_SUFFIX) || contentLength <= MID_UPLOAD_BYTES) return undefined;
    if (held.has(sandboxId) || !planned(sandboxId, 'release:mid-upload')) return undefined;
    held.add(sandboxId);
    return {
      afterBytes: MID_UPLOAD_BYTES,
      onHeld: () => void stopHere(sandboxId, 'release:mid-upload', undefined, key),
    };
  };
}

function killableProvider(deps: ProviderDeps): SandboxProvider {
  const commands = process.env.KILL_PROVIDER === 'bwrap' ? { commands: bubblewrapCommands() } : {};
  const local = createLocalProvider(deps, { name: 'killable', ...commands });
  return {
    ...local,
    async release(request, context) {
      if (planned(request.sandboxId, 'release:before-snapshot'))
        await stopHere(request.sandboxId, 'release:before-snapshot', context);
      const receipt = await local.release(request, context);
      log({
        event: 'release',
        sandboxId: request.sandboxId,
        key: request.idempotencyKey,
        duplicate: receipt.duplicate,
        uri: receipt.checkpoint?.uri,
      });
      if (planned(request.sandboxId, 'release:after-terminate'))
        await stopHere(request.sandboxId, 'release:after-terminate', context);
      return receipt;
    },
    async restore(request, context) {
      if (planned(request.sandboxId, 'restore:before')) await stopHere(request.sandboxId, 'restore:before', context);
      const result = await local.restore(request, context);
      log({ event: 'restore', sandboxId: request.sandboxId, source: result.source });
      if (planned(request.sandboxId, 'restore:after')) await stopHere(request.sandboxId, 'restore:after', context);
      return result;
    },
  };
}

async function main(): Promise<void> {
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const config = loadConfig(process.env);
  const bundle = JSON.parse(readFileSync(env('KILL_BUNDLE'), 'utf8')) as WorkflowBundleWithSourceMap;
  // In this process: killed with it, it leaves the store a PutObject cut part-way, as a real kill does.
  const proxy = await startS3Proxy(env('STASIS_S3_ENDPOINT'));
  proxy.hold = holdPackPut(config.STASIS_S3_BUCKET);
  const store = killableStore(
    new S3CheckpointStore({
      bucket: config.STASIS_S3_BUCKET,
      region: config.STASIS_S3_REGION,
      endpoint: proxy.url,
      credentials: { accessKeyId: env('AWS_ACCESS_KEY_ID'), secretAccessKey: env('AWS_SECRET_ACCESS_KEY') },
      partSizeBytes: PART_BYTES,
    }),
  );
  const worker = await createStasisWorker({ config, providers: [killableProvider], workflowBundle: bundle, store });
  const running = worker.run();
  log({ event: 'ready' });
  process.stdout.write('READY\n');
  await running;
}

main().catch((err: unknown) => {
  process.stderr.write(`kill-worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
