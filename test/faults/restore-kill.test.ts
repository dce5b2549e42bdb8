import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { Checkpoint } from '../../common/schemas';
import { createLocalProvider } from '../../providers/local';
import { killSandbox } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, manifest, s3StoreFromEnv, tempDir, uniqueId, waitFor } from '../providers/helpers';
import { makeHost, sh } from '../providers/harness';
import { Tally, writeSummary } from './helpers';
import { INSIDE_RESTORE_POINTS } from './kill-points';
import { exitOf, runRestoreWorker } from './restore-worker-process';

// Area restore-kill: a restore on another host (its own data dir and host id,
// the checkpoint from MinIO, no local copy) in a worker process SIGKILLed inside
// the restore: mid-download, mid-extract, and between the two renames of the
// swap (the old workspace moved aside, the new one not yet in place). A new
// process then retries the same restore: it must complete, every file as it was
// packed (venv links included), and nothing of the killed attempt left behind.

const TRIALS_PER_POINT = 2;
const tally = new Tally();
let kills = 0;
let leftovers = 0;

/** A workspace of a few hundred files, a venv with links out of the sandbox, and 12 MB that do not compress. */
async function populate(root: string): Promise<void> {
  const workspace = path.join(root, 'workspace');
  for (let d = 0; d < 20; d += 1) {
    const dir = path.join(workspace, 'src', `pkg${d}`);
    await fs.mkdir(dir, { recursive: true });
    for (let f = 0; f < 15; f += 1) await fs.writeFile(path.join(dir, `f${f}.txt`), randomBytes(200 + f * 10));
  }
  await fs.writeFile(path.join(workspace, 'blob.bin'), randomBytes(12 * 1024 * 1024));
  const venv = path.join(root, 'envs', 'venv');
  await fs.mkdir(path.join(venv, 'bin'), { recursive: true });
  await fs.symlink('/usr/bin/python3', path.join(venv, 'bin', 'python3'));
  await fs.symlink('python3', path.join(venv, 'bin', 'python'));
  await fs.symlink('/nonexistent/dangling', path.join(venv, 'bin', 'gone'));
  await fs.mkdir(path.join(root, 'home', '.config'), { recursive: true });
  await fs.writeFile(path.join(root, 'home', '.config', 'settings'), 'a=1\n');
}

/** What a restore leaves in a sandbox's root (its download) and on its volume (staged and swapped-out trees). */
async function leftoversIn(volume: string): Promise<string[]> {
  const root = path.dirname(volume);
  return [
    ...(await fs.readdir(root)).filter((name) => !['meta', 'volume'].includes(name)),
    ...(await fs.readdir(volume)).filter((name) => !['envs', 'home', 'workspace'].includes(name)),
  ];
}

let source: { root: string; checkpoint: Checkpoint; sandboxId: string };

beforeAll(async () => {
  const host = await makeHost({ store: s3StoreFromEnv() });
  const sandboxId = await host.sandbox();
  const root = sandboxPaths(host.dataDir, sandboxId).volume;
  await populate(root);
  const receipt = await host.provider.release(
    { sandboxId, idempotencyKey: `${sandboxId}/2`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
    context(),
  );
  source = { root, checkpoint: receipt.checkpoint!, sandboxId };
}, 300_000);

describe.each(INSIDE_RESTORE_POINTS)('SIGKILL %s', (point) => {
  it.each(Array.from({ length: TRIALS_PER_POINT }, (_, i) => i))(
    `trial %i: the retry on the same host completes, nothing lost, nothing left behind`,
    async (trial) => {
      const id = `${point}#${trial}`;
      tally.start(id);
      const dataDir = await tempDir('restore-kill');
      const hostId = uniqueId('rk-host');
      const request = { sandboxId: source.sandboxId, fence: 3, checkpoint: source.checkpoint };
      const marker = path.join(dataDir, 'stopped');

      const killed = runRestoreWorker({ dataDir, hostId, request, point, marker });
      const exited = exitOf(killed);
      await waitFor(`the restore to stop at ${point}`, async () => existsSync(marker), 180_000);
      killed.kill('SIGKILL');
      expect((await exited).code).toBeNull();
      kills += 1;
      tally.inject();
      // The kill really came in the middle: no restore result, and the restore's work in progress is on disk.
      const root = sandboxPaths(dataDir, source.sandboxId).volume;
      expect(existsSync(path.join(dataDir, 'restored.json'))).toBe(false);
      expect((await leftoversIn(root)).length).toBeGreaterThan(0);

      const retry = await exitOf(runRestoreWorker({ dataDir, hostId, request, marker: `${marker}-retry` }));
      expect({ code: retry.code, stderr: retry.stderr }).toEqual({ code: 0, stderr: '' });
      expect(JSON.parse(await fs.readFile(path.join(dataDir, 'restored.json'), 'utf8'))).toMatchObject({
        source: 'checkpoint',
      });
      for (const dir of ['workspace', 'home', 'envs']) {
        expect({ dir, same: await manifest(path.join(root, dir)) }).toEqual({
          dir,
          same: await manifest(path.join(source.root, dir)),
        });
      }
      const left = await leftoversIn(root);
      leftovers += left.length;
      expect(left).toEqual([]);
      // The restored sandbox runs: its compute came up on the restored files.
      const restored = createLocalProvider({ hostId, dataDir, store: s3StoreFromEnv() });
      expect(await sh(restored, source.sandboxId, 'readlink ../envs/venv/bin/python3; wc -c < blob.bin', 3)).toBe(
        `/usr/bin/python3\n${12 * 1024 * 1024}\n`,
      );
      await killSandbox({ hostId, sandboxId: source.sandboxId });
      tally.ok(id);
    },
    300_000,
  );
});

test('summary: every killed restore completed on retry, nothing lost, nothing left', () => {
  writeSummary('restore-kill', tally, {
    kills,
    points: INSIDE_RESTORE_POINTS.length,
    leftovers,
  });
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBe(INSIDE_RESTORE_POINTS.length * TRIALS_PER_POINT);
  expect(kills).toBe(tally.trials);
});
