import { lstat, realpath } from 'node:fs/promises';
import * as path from 'node:path';
import { StasisError } from './errors';
import type { CreateSandboxInput, RunSpec, Workspace } from './schemas';

// Active workspaces put a sandbox's files on a host directory. Only directories
// under a prefix of STASIS_HOST_PATHS may be used (unset: none), never `/` and
// never anything that overlaps the data dir. A prefix test on the string alone
// is bypassed with `..` or a symlink, so `.` and `..` are refused and the path
// is checked both as written and as the host resolves it now.

/** Where active workspaces may live. */
export interface HostPathPolicy {
  /** Absolute directories (STASIS_HOST_PATHS); empty: no active workspace is allowed. */
  allowed: readonly string[];
  /** STASIS_DATA_DIR: never inside, above or at it. */
  dataDir?: string;
}

/** The active workspaces a RunSpec asks for (its own and its scripted children's), with their fields. */
export function activeWorkspacesOfRun(spec: RunSpec, at = ''): { field: string; hostPath: string }[] {
  const steps = 'steps' in spec.agent ? spec.agent.steps : [];
  return [
    ...activeWorkspace(spec.sandbox.workspace, `${at}sandbox.workspace`),
    ...steps.flatMap((step, i) =>
      'spawn' in step ? activeWorkspacesOfRun(step.spawn, `${at}agent.steps.${i}.spawn.`) : [],
    ),
  ];
}

/** The active workspace a sandbox asks for, with its field. */
export function activeWorkspacesOfSandbox(input: CreateSandboxInput): { field: string; hostPath: string }[] {
  return activeWorkspace(input.workspace, 'workspace');
}

function activeWorkspace(workspace: Workspace | undefined, field: string): { field: string; hostPath: string }[] {
  return workspace?.kind === 'active' ? [{ field: `${field}.hostPath`, hostPath: workspace.hostPath }] : [];
}

/** `child` is `parent` or lies below it (`/srv/ok-evil` is not below `/srv/ok`). */
export function isWithin(child: string, parent: string): boolean {
  return child === parent || child.startsWith(parent.endsWith('/') ? parent : `${parent}/`);
}

const errnoOf = (err: unknown): string | undefined => (err as NodeJS.ErrnoException).code;

/**
 * The path as the host resolves it now: the deepest existing ancestor through
 * realpath, the rest as written. A dangling symlink on the way is refused (a
 * later mkdir would follow it anywhere).
 */
export async function resolveOnHost(absolute: string): Promise<string> {
  const missing: string[] = [];
  let at = absolute;
  for (;;) {
    try {
      return path.join(await realpath(at), ...missing.reverse());
    } catch (err) {
      if (errnoOf(err) !== 'ENOENT' && errnoOf(err) !== 'ENOTDIR') throw err;
    }
    const exists = await lstat(at).then(
      () => true,
      () => false,
    );
    if (exists) {
      // Created between the two calls (another sandbox's workspace in the same new parent): resolve it again.
      const real = await realpath(at).catch(() => undefined);
      if (real !== undefined) return path.join(real, ...missing.reverse());
      throw new Error(`${at} is a dangling symlink or not a directory`);
    }
    missing.push(path.basename(at));
    at = path.dirname(at);
  }
}

/**
 * Throws INVALID_ARGUMENT naming `field` unless `hostPath` may be an active
 * workspace under `policy`. Nothing is created.
 */
export async function checkHostPath(hostPath: string, policy: HostPathPolicy, field: string): Promise<void> {
  const refuse = (why: string) => new StasisError('INVALID_ARGUMENT', `${field}: ${JSON.stringify(hostPath)} ${why}`);
  if (!path.isAbsolute(hostPath) || hostPath.includes('\0')) throw refuse('must be an absolute path');
  // The kernel takes `..` after a symlink from the symlink's target, not from the
  // text before it: a path with `.` or `..` is refused rather than guessed at.
  if (hostPath.split('/').some((segment) => segment === '.' || segment === '..'))
    throw refuse('must not contain "." or ".." segments');
  const written = path.resolve(hostPath);
  let real: string;
  try {
    real = await resolveOnHost(written);
  } catch (err) {
    throw refuse(`cannot be resolved on this host (${(err as Error).message})`);
  }
  if (written === '/' || real === '/') throw refuse('is the root directory');
  if (policy.dataDir) {
    const dataDirs = [path.resolve(policy.dataDir), await resolveOnHost(path.resolve(policy.dataDir)).catch(() => '')];
    for (const dataDir of dataDirs.filter(Boolean)) {
      for (const candidate of [written, real])
        if (isWithin(candidate, dataDir) || isWithin(dataDir, candidate))
          throw refuse("overlaps Stasis's data directory");
    }
  }
  if (policy.allowed.length === 0) throw refuse('is not allowed: STASIS_HOST_PATHS allows no active workspace here');
  for (const prefix of policy.allowed) {
    const realPrefix = await resolveOnHost(path.resolve(prefix)).catch(() => undefined);
    if (realPrefix && isWithin(written, path.resolve(prefix)) && isWithin(real, realPrefix)) return;
  }
  throw refuse(`is not under a directory of STASIS_HOST_PATHS (${policy.allowed.join(', ')})`);
}

/** Checks every active workspace a request asks for; the first refusal names its field. */
export async function checkHostPaths(
  workspaces: { field: string; hostPath: string }[],
  policy: HostPathPolicy,
  prefix = '',
): Promise<void> {
  for (const { field, hostPath } of workspaces) await checkHostPath(hostPath, policy, `${prefix}${field}`);
}
