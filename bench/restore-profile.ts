import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createLocalProvider } from '../providers/local';
import { sandboxPaths } from '../providers/sandbox-state';
import { prepareVolume, releaseVolume, volumeSupport, type VolumeMode } from '../providers/volume';
import { DEFAULT_ARCHIVE_LIMITS } from '../stores/archive';
import { restoreCheckpoint } from '../stores/cas/restore';
import { FsCheckpointStore } from '../stores/fs';
import { fillNodeModules } from './workspace';
import { runScript } from './script';

// Issue 16's diagnosis, kept to be run again (not part of `npm run bench`): where a cross-host restore of
// a many-small-files workspace spends its time. `node dist/bench/restore-profile.js [dir] [files]`
// prints the first snapshot, the engine alone onto a loop-mounted ext4 volume and onto a plain
// directory of `dir`'s filesystem, and the provider's whole restore with and without sandbox volumes.

async function timed<T>(label: string, fn: () => Promise<T>): Promise<T> {
  const start = process.hrtime.bigint();
  const value = await fn();
  console.log(`${label}: ${(Number(process.hrtime.bigint() - start) / 1e6).toFixed(0)} ms`);
  return value;
}

async function main(): Promise<void> {
  const root = path.resolve(process.argv[2] ?? '/tmp/stasis-restore-profile');
  const files = Number(process.argv[3] ?? 20_000);
  await fs.rm(root, { recursive: true, force: true });
  await fs.mkdir(root, { recursive: true });
  const store = new FsCheckpointStore(path.join(root, 'store'));
  const source = path.join(root, 'source');
  await fillNodeModules(source, files);
  const a = createLocalProvider({ hostId: 'profile-a', dataDir: path.join(root, 'a'), store });
  const id = 'profile';
  const ctxA = { ownerId: id, hostId: 'profile-a' };
  await a.provision({ sandboxId: id, fence: 1 }, ctxA);
  const pathsA = sandboxPaths(path.join(root, 'a'), id);
  await fs.rm(pathsA.workspace, { recursive: true, force: true });
  await fs.cp(source, pathsA.workspace, { recursive: true });
  await a.start({ sandboxId: id, fence: 1 }, ctxA);
  const released = await timed('first snapshot (provider release)', () =>
    a.release(
      { sandboxId: id, fence: 1, idempotencyKey: 'profile', mode: 'SNAPSHOT_AND_TERMINATE', reason: 'profile' },
      ctxA,
    ),
  );
  const checkpoint = released.checkpoint;
  if (!checkpoint) throw new Error('the release returned no checkpoint');
  const engine = (targetDir: string, tempPrefix: string) =>
    restoreCheckpoint({
      store,
      checkpoint,
      targetDir,
      tempPrefix,
      limits: DEFAULT_ARCHIVE_LIMITS,
      progress: { bytes: 0 },
    });
  let fence = 2;
  if (volumeSupport() === undefined) {
    const paths = sandboxPaths(path.join(root, 'engine'), 'volume');
    await prepareVolume(paths, 10_240, 'auto');
    await fs.mkdir(path.join(paths.volume, 'target'));
    await timed('engine restoreCheckpoint onto a fresh loop-mounted ext4', () =>
      engine(path.join(paths.volume, 'target'), path.join(paths.root, 'download')),
    );
    await releaseVolume(paths);
  }
  await fs.mkdir(path.join(root, 'plain'));
  await timed(`engine restoreCheckpoint onto a plain directory of ${root}`, () =>
    engine(path.join(root, 'plain'), path.join(root, 'download')),
  );
  const modes: VolumeMode[] = volumeSupport() === undefined ? ['off', 'auto'] : ['off'];
  const restored: { provider: ReturnType<typeof createLocalProvider>; hostId: string }[] = [];
  for (const volumes of modes) {
    const hostId = `profile-b-${volumes}`;
    const b = createLocalProvider({ hostId, dataDir: path.join(root, hostId), store, volumes });
    const result = await timed(`provider cross-host restore (volumes ${volumes})`, () =>
      b.restore({ sandboxId: id, fence: fence++, checkpoint }, { ownerId: id, hostId }),
    );
    if (result.source !== 'checkpoint') throw new Error(`the restore used ${result.source}`);
    restored.push({ provider: b, hostId });
  }
  // Destroyed only now: destroying the sandbox anywhere deletes its checkpoints.
  for (const { provider, hostId } of restored)
    await provider.destroy({ sandboxId: id, fence }, { ownerId: id, hostId });
  await a.destroy({ sandboxId: id, fence }, ctxA);
  await fs.rm(root, { recursive: true, force: true });
}

runScript(main);
