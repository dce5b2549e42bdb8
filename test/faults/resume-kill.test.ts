import { existsSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { SandboxReleaseRequest } from '../../providers/api';
import { scanSandboxProcesses } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, s3StoreFromEnv, waitFor } from '../providers/helpers';
import { makeHost, sh } from '../providers/harness';
import { Tally, writeSummary } from './helpers';
import { exitOf, runRestoreWorker } from './restore-worker-process';

// Area resume-kill: a resume from the dormant local copy, in a worker process
// SIGKILLed right after the sandbox's compute started, before the call answered.
// The sandbox writes meanwhile. Whatever the worker does next on that host —
// release the sandbox, or retry the resume and then release it — the next
// checkpoint, restored from the store on another host, holds that write, and
// nothing of the killed attempt keeps running.

const tally = new Tally();

const release = (sandboxId: string, fence: number): SandboxReleaseRequest => ({
  sandboxId,
  idempotencyKey: `${sandboxId}/${fence}`,
  mode: 'SNAPSHOT_AND_TERMINATE',
  fence,
  reason: 'test',
});

describe.each(['a release', 'the resume retried, then a release'])('SIGKILL after compute started, then %s', (next) => {
  it.each([0, 1])(
    'trial %i: the write made before the kill is in the next checkpoint',
    async (trial) => {
      const id = `${next}#${trial}`;
      tally.start(id);
      const store = s3StoreFromEnv();
      const host = await makeHost({ store });
      const other = await makeHost({ store });
      const sandboxId = await host.sandbox();
      await sh(host.provider, sandboxId, 'echo first > a.txt');
      const first = (await host.provider.release(release(sandboxId, 2), context())).checkpoint!;

      const marker = path.join(host.dataDir, 'stopped');
      const request = { sandboxId, fence: 3, checkpoint: first };
      const killed = runRestoreWorker({
        dataDir: host.dataDir,
        hostId: host.hostId,
        request,
        point: 'resume:after-start',
        marker,
      });
      const exited = exitOf(killed);
      await waitFor('the resume to stop after starting compute', async () => existsSync(marker), 120_000);
      // The sandbox's compute at work: what it writes before the worker dies.
      await fs.writeFile(path.join(sandboxPaths(host.dataDir, sandboxId).workspace, 'a.txt'), 'second\n');
      killed.kill('SIGKILL');
      expect((await exited).code).toBeNull();
      tally.inject();

      // The worker again, on the same host.
      const provider = host.restart();
      if (next !== 'a release') await provider.restore(request, context());
      const checkpoint = (await provider.release(release(sandboxId, 4), context())).checkpoint!;
      expect(checkpoint.uri).not.toBe(first.uri);
      expect((await scanSandboxProcesses(host.hostId)).has(sandboxId)).toBe(false);
      // From the store, on another host.
      expect((await other.provider.restore({ sandboxId, fence: 5, checkpoint }, context())).source).toBe('checkpoint');
      expect(await sh(other.provider, sandboxId, 'cat a.txt', 5)).toBe('second\n');
      tally.ok(id);
    },
    300_000,
  );
});

test('summary: no write of a killed resume was lost', () => {
  writeSummary('resume-kill', tally);
  expect(tally.lostItems).toEqual([]);
  expect(tally.trials).toBe(4);
  expect(tally.faults).toBe(tally.trials);
});
