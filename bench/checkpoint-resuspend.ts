import * as fs from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import type { CheckpointStore } from '../stores/api';
import { DEFAULT_ARCHIVE_LIMITS } from '../stores/archive';
import type { Baseline } from '../stores/cas/baseline';
import { encodeTop, readManifest, splitManifest } from '../stores/cas/manifest';
import { restoreCheckpoint } from '../stores/cas/restore';
import { takeCheckpoint } from '../stores/cas/upload';
import { FsCheckpointStore } from '../stores/fs';
import { fillNodeModules } from './workspace';

// Issue 16, kept to be run again (not part of `npm run bench`): what an unchanged re-suspend costs
// in the engine alone after a restore from the store on "another host" (a fresh directory: new
// inodes and ctimes), and what encoding and reading the top object costs per call.
// `node dist/bench/checkpoint-resuspend.js [dir] [files]`.

const NAMES = ['workspace', 'home', 'envs'];

function ms(start: bigint): string {
  return (Number(process.hrtime.bigint() - start) / 1e6).toFixed(1);
}

/** The store, counting the objects written. */
function counting(inner: CheckpointStore): CheckpointStore & { puts: string[] } {
  const puts: string[] = [];
  return Object.assign(Object.create(inner) as CheckpointStore, {
    puts,
    putBytes: (
      key: string,
      ...rest: Parameters<CheckpointStore['putBytes']> extends [string, ...infer R] ? R : never
    ) => {
      puts.push(key);
      return inner.putBytes(key, ...rest);
    },
    put: (key: string, ...rest: Parameters<CheckpointStore['put']> extends [string, ...infer R] ? R : never) => {
      puts.push(key);
      return inner.put(key, ...rest);
    },
  });
}

async function main(): Promise<void> {
  const root = path.resolve(process.argv[2] ?? path.join(os.tmpdir(), 'stasis-resuspend'));
  const files = Number(process.argv[3] ?? 20_000);
  await fs.rm(root, { recursive: true, force: true });
  await fs.mkdir(root, { recursive: true });
  const store = counting(new FsCheckpointStore(path.join(root, 'store')));
  const source = path.join(root, 'a');
  for (const name of NAMES) await fs.mkdir(path.join(source, name), { recursive: true });
  await fillNodeModules(path.join(source, 'workspace'), files);
  let n = 0;
  const take = (dir: string, baseline?: Baseline) =>
    takeCheckpoint({
      store,
      rootDir: dir,
      names: NAMES,
      prefix: 'checkpoints/bench/',
      name: `t${(n += 1)}`,
      labels: {},
      limits: DEFAULT_ARCHIVE_LIMITS,
      ...(baseline ? { baseline } : {}),
      progress: { bytes: 0 },
    });
  const report = (label: string, start: bigint, taken: Awaited<ReturnType<typeof take>>) => {
    const { files: f, filesHashed, packs, segments, topBytes } = taken.stats;
    console.log(
      `${label}: ${ms(start)} ms, objects written ${store.puts.length}, files ${f}, hashed ${filesHashed}, packs ${packs}, segments ${segments}, top ${topBytes} B`,
    );
    store.puts.length = 0;
  };
  await new Promise((resolve) => setTimeout(resolve, 100));
  let start = process.hrtime.bigint();
  const first = await take(source);
  report('first suspend', start, first);
  await new Promise((resolve) => setTimeout(resolve, 100));
  start = process.hrtime.bigint();
  report('unchanged re-suspend, same host', start, await take(source, first.baseline));

  const other = path.join(root, 'b');
  await fs.mkdir(other);
  start = process.hrtime.bigint();
  const restored = await restoreCheckpoint({
    store,
    checkpoint: first.checkpoint,
    targetDir: other,
    tempPrefix: path.join(root, 'restore-tmp'),
    limits: DEFAULT_ARCHIVE_LIMITS,
    progress: { bytes: 0 },
  });
  console.log(`restore on another host: ${ms(start)} ms`);
  start = process.hrtime.bigint();
  const afterRestore = await take(other, restored.baseline);
  report('unchanged re-suspend after the restore', start, afterRestore);
  await new Promise((resolve) => setTimeout(resolve, 100));
  start = process.hrtime.bigint();
  const again = await take(other, afterRestore.baseline);
  report('unchanged re-suspend after that', start, again);
  const pkg = (await fs.readdir(path.join(other, 'workspace', 'node_modules')))[0];
  const dir = path.join(other, 'workspace', 'node_modules', pkg);
  const file = (await fs.readdir(dir, { recursive: true, withFileTypes: true })).find((e) => e.isFile())!;
  await fs.appendFile(path.join(file.parentPath, file.name), 'changed');
  await new Promise((resolve) => setTimeout(resolve, 100));
  start = process.hrtime.bigint();
  report('one file changed', start, await take(other, again.baseline));

  // The top object alone, per call.
  const { segments, takenAtNs, packs } = splitManifest(again.baseline.manifest);
  const top = { format: 'stasis-cas-2' as const, takenAtNs, segments: segments.map((s) => s.ref), packs };
  const rounds = 20;
  start = process.hrtime.bigint();
  let body: Buffer = Buffer.alloc(0);
  for (let i = 0; i < rounds; i += 1) body = await encodeTop(top);
  console.log(
    `encodeTop: ${(Number(process.hrtime.bigint() - start) / 1e6 / rounds).toFixed(2)} ms per call (${body.length} B)`,
  );
  start = process.hrtime.bigint();
  for (let i = 0; i < rounds; i += 1) {
    await readManifest(
      store,
      await store.read(again.checkpoint.uri, 1 << 26),
      again.checkpoint.uri,
      DEFAULT_ARCHIVE_LIMITS,
    );
  }
  console.log(
    `readManifest (top and ${segments.length} segments): ${(Number(process.hrtime.bigint() - start) / 1e6 / rounds).toFixed(1)} ms per call`,
  );
  start = process.hrtime.bigint();
  for (let i = 0; i < rounds; i += 1) splitManifest(again.baseline.manifest);
  console.log(
    `splitManifest, every segment serialised: ${(Number(process.hrtime.bigint() - start) / 1e6 / rounds).toFixed(1)} ms per call`,
  );
  start = process.hrtime.bigint();
  for (let i = 0; i < rounds; i += 1) splitManifest(again.baseline.manifest, again.baseline.manifest);
  console.log(
    `splitManifest, segments of the baseline reused: ${(Number(process.hrtime.bigint() - start) / 1e6 / rounds).toFixed(1)} ms per call`,
  );
  console.log(
    `load average: ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  await fs.rm(root, { recursive: true, force: true });
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
