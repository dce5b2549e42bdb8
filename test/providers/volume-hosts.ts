import { execFileSync } from 'node:child_process';
import type { ProviderDeps } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { mountsUnder } from './helpers';
import { makeHost, type Host } from './harness';

// Hosts whose sandboxes must live on loop-mounted volumes (`volumes: 'required'`), and the snapshot
// release the re-suspend tests make: shared by resuspend, unchanged and unchanged-attack tests.

const make = (deps: ProviderDeps) => createLocalProvider({ ...deps, volumes: 'required' });

/** A SNAPSHOT_AND_TERMINATE release at `fence`, its idempotency key derived from both. */
export const snapshot = (sandboxId: string, fence: number) => ({
  sandboxId,
  idempotencyKey: `${sandboxId}/${fence}`,
  mode: 'SNAPSHOT_AND_TERMINATE' as const,
  fence,
  reason: 'test',
});

const hosts: Host[] = [];
// A failed test leaves its sandboxes: their volumes are unmounted here, so nothing stays mounted on the machine.
afterAll(() => {
  for (const host of hosts) for (const point of mountsUnder(host.dataDir)) execFileSync('umount', ['--lazy', point]);
});

/** A host on volumes, with `store` if given (another host restoring the first one's checkpoints). */
export async function volumeHost(store?: Host['store']): Promise<Host> {
  const host = await makeHost({ make, ...(store ? { store } : {}) });
  hosts.push(host);
  return host;
}
