import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { z } from 'zod';
import { StasisError } from '../common/errors';
import { Checkpoint, EnvMap, Identifier, SandboxLimits, Workspace } from '../common/schemas';
import { hasErrorCode, writeFileAtomic } from '../stores/atomic-file';

// A sandbox on this host is the directory `<dataDir>/sandboxes/<sandboxId>/`:
// `volume/` (the mount point of the sandbox's own volume, volume.ts) holding its trees
// `workspace/` (a symlink to the host path for an active workspace), `home/` and
// `envs/`, and the provider-private `meta/` with `state.json` `receipts/` and `jobs/`.

export interface SandboxPaths {
  root: string;
  /** Where the sandbox's trees live: its volume's mount point. */
  volume: string;
  /** The image of the volume, when the host mounts one. */
  volumeImage: string;
  workspace: string;
  home: string;
  envs: string;
  meta: string;
  stateFile: string;
  receipts: string;
  jobs: string;
}

export function sandboxesDir(dataDir: string): string {
  return path.join(dataDir, 'sandboxes');
}

export function sandboxPaths(dataDir: string, sandboxId: string): SandboxPaths {
  return sandboxPathsIn(sandboxesDir(dataDir), sandboxId);
}

/** The paths of `sandboxId` under a provider's sandboxes directory; refuses ids that are not plain names. */
export function sandboxPathsIn(dir: string, sandboxId: string): SandboxPaths {
  const parsed = Identifier.safeParse(sandboxId);
  if (!parsed.success) {
    throw new StasisError(
      'INVALID_ARGUMENT',
      `sandboxId ${JSON.stringify(sandboxId)}: ${parsed.error.issues[0]?.message}`,
    );
  }
  const root = path.join(dir, sandboxId);
  const meta = path.join(root, 'meta');
  const volume = path.join(root, 'volume');
  return {
    root,
    volume,
    volumeImage: path.join(root, 'volume.img'),
    workspace: path.join(volume, 'workspace'),
    home: path.join(volume, 'home'),
    envs: path.join(volume, 'envs'),
    meta,
    stateFile: path.join(meta, 'state.json'),
    receipts: path.join(meta, 'receipts'),
    jobs: path.join(meta, 'jobs'),
  };
}

export const ComputeStatus = z.enum(['created', 'running', 'paused', 'stopped']);
export type ComputeStatus = z.infer<typeof ComputeStatus>;

/** A snapshot release left this directory as a local copy of `checkpoint`. */
export const Dormant = z.object({
  checkpoint: Checkpoint,
  labels: z.record(z.string(), z.string()),
  since: z.string(),
});
export type Dormant = z.infer<typeof Dormant>;

/** One sandbox as its host stores it (state.json); not the user-visible SandboxState of common/schemas. */
export const HostSandboxState = z.object({
  sandboxId: z.string(),
  hostId: z.string(),
  /** The highest fence any call has carried; lower ones are refused. */
  maxFence: z.number().int().nonnegative(),
  /** Counts compute generations; each termination of compute starts a new one. */
  generation: z.number().int().nonnegative(),
  /** The grant of the current generation; rotated whenever compute is terminated. */
  grant: z.string(),
  status: ComputeStatus,
  workspace: Workspace,
  env: EnvMap,
  /** The sandbox's own limits; the host's defaults fill in the rest at each start. */
  limits: SandboxLimits.optional(),
  template: z.string().optional(),
  /** The provisionId the sandbox was provisioned under (ProvisionRequest): another is refused. */
  provisionedBy: z.string().optional(),
  dormant: Dormant.optional(),
  /** The checkpoint the running files came from, so a retried restore does not unpack it again. */
  restoredFrom: z.object({ sha256: z.string(), labels: z.record(z.string(), z.string()) }).optional(),
  createdAt: z.string(),
  updatedAt: z.string(),
});
export type HostSandboxState = z.infer<typeof HostSandboxState>;

export async function readState(paths: SandboxPaths): Promise<HostSandboxState | undefined> {
  let text: string;
  try {
    text = await fs.readFile(paths.stateFile, 'utf8');
  } catch (err) {
    if (hasErrorCode(err, 'ENOENT')) return undefined;
    throw err;
  }
  return HostSandboxState.parse(JSON.parse(text));
}

export async function writeState(paths: SandboxPaths, state: HostSandboxState): Promise<void> {
  await writeFileAtomic(paths.stateFile, JSON.stringify({ ...state, updatedAt: new Date().toISOString() }, null, 2));
}

export function newGrant(): string {
  return randomBytes(16).toString('hex');
}

/** Ends the current compute generation: grants issued for it stop being valid. */
export function rotateGrant(state: HostSandboxState): void {
  state.generation += 1;
  state.grant = newGrant();
}
