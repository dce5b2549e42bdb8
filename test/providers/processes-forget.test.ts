import { mkdirSync } from 'node:fs';
import { hostCommands, spawnInSandbox, waitForOutcome } from '../../providers/command';
import { DEFAULT_LIMITS } from '../../providers/limits';
import { byIndex, killSandbox, markerEnv } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { tempDir, uniqueId } from './helpers';

// The process index learns of every process the starter starts. Where the host has cgroups nothing walked
// the index (the only place that dropped an entry), so every sandbox a worker ever ran stayed in it: a heap
// snapshot of a worker after 300 Runs completed. A sandbox killed leaves nothing there, with or without cgroups.

test('sandboxes whose processes ran and were killed leave nothing in the process index', async () => {
  const dataDir = await tempDir('proc-forget');
  const hostId = uniqueId('host-forget');
  const before = byIndex.size();
  for (let i = 0; i < 5; i++) {
    const marker = { hostId, sandboxId: uniqueId('sbx-forget') };
    const paths = sandboxPaths(dataDir, marker.sandboxId);
    mkdirSync(paths.workspace, { recursive: true });
    mkdirSync(paths.home, { recursive: true });
    // A command that ran to its end, and one still running when the sandbox is killed.
    const done = await spawnInSandbox(hostCommands, paths, ['/bin/sh', '-c', 'exit 0'], {
      sandbox: { marker, limits: DEFAULT_LIMITS },
      env: markerEnv(marker),
    });
    await waitForOutcome(done, {});
    await spawnInSandbox(hostCommands, paths, ['/bin/sh', '-c', 'sleep 60'], {
      sandbox: { marker, limits: DEFAULT_LIMITS },
      env: markerEnv(marker),
      background: true,
    });
    await killSandbox(marker);
  }
  expect(byIndex.size()).toBe(before);
}, 60_000);
