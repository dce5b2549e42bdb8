import { existsSync } from 'node:fs';
import * as path from 'node:path';
import { evictUnderPressure } from '../../providers/maintenance';
import { scanSandboxProcesses } from '../../providers/processes';
import { sandboxesDir, sandboxPaths } from '../../providers/sandbox-state';
import { createCheckpointStore } from '../../stores';
import { maintainHost } from '../../workers/maintenance';
import type { TestStack } from './stack';

/** The data directory of `hostId` in the stack. */
export const hostDataDir = (stack: TestStack, hostId: string): string =>
  path.join(stack.config.STASIS_DATA_DIR, 'hosts', hostId);

/**
 * Removes the dormant copies on `hostId` (as disk pressure would: no free bytes at all), so a
 * resume there has to download its checkpoint; the ids of the sandboxes whose copies went.
 */
export async function evictDormantCopies(stack: TestStack, hostId = 'host-a'): Promise<string[]> {
  const dir = sandboxesDir(hostDataDir(stack, hostId));
  return (await evictUnderPressure({ sandboxesDir: dir, minFreeBytes: 1, freeBytes: async () => 0 })).evicted;
}

/** What of `sandboxId` is still on `hostId`: its directory, and how many of its processes run. */
export async function leftOn(
  stack: TestStack,
  hostId: string,
  sandboxId: string,
): Promise<{ directory: boolean; processes: number }> {
  return {
    directory: existsSync(sandboxPaths(hostDataDir(stack, hostId), sandboxId).root),
    processes: (await scanSandboxProcesses(hostId)).get(sandboxId)?.length ?? 0,
  };
}

/** `hostId` is back: its worker starts (the caller stops it) and runs one maintenance pass; the sandboxes that pass destroyed. */
export async function backAndMaintained(stack: TestStack, hostId: string): Promise<string[]> {
  const worker = await stack.startWorker(hostId);
  const pass = await maintainHost({
    config: stack.config,
    dataDir: hostDataDir(stack, hostId),
    hostId,
    client: stack.temporal,
    registry: worker.registry,
    store: createCheckpointStore(stack.config),
  });
  return pass.destroyed;
}
