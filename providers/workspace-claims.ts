import * as path from 'node:path';
import { StasisError } from '../common/errors';
import { isWithin, resolveOnHost } from '../common/host-paths';
import { withLifecycleLock } from './lock';

// A sandbox owns every name inside its active workspace: it may rename a directory there and put a
// symlink in its place. If another sandbox's active workspace were that directory, the link would
// become the other sandbox's workspace, which the worker binds and walks by its host path (bwrap's
// --bind and the walk's top name follow it): its commands would run on any host directory the link
// names, as the worker's user. So on one host no active workspace may lie inside another's. The same
// directory for two sandboxes is allowed: neither can reach its name, only what is inside it.

/** An active workspace a sandbox of this host has on record: its state's host path. */
export interface RecordedWorkspace {
  sandboxId: string;
  hostPath: string;
}

/** The active workspaces of one host's sandboxes, checked for nesting as each is laid out. */
export class WorkspaceClaims {
  /** Host paths (as resolved) of provisions and restores under way, whose state may not be written yet. */
  private readonly inFlight = new Map<string, string>();

  /**
   * `recorded`: the active workspaces in the host's sandbox states now; `lockKey`: this host's key of the
   * lifecycle lock (no sandbox id holds `:`), so two claims on one host never interleave.
   */
  constructor(
    private readonly recorded: () => Promise<RecordedWorkspace[]>,
    private readonly lockKey: string,
  ) {}

  /**
   * Claims `hostPath` for `sandboxId` until `settled`: INVALID_ARGUMENT naming `field` if it lies inside or
   * around the active workspace of another sandbox of this host, recorded or being laid out.
   */
  claim(sandboxId: string, hostPath: string, field: string): Promise<void> {
    // One claim at a time: two provisions of nested paths at once must not both pass.
    return withLifecycleLock(this.lockKey, () => this.check(sandboxId, hostPath, field));
  }

  /** The sandbox's provision or restore is over: its state on disk (or none) is the record from now on. */
  settled(sandboxId: string): void {
    this.inFlight.delete(sandboxId);
  }

  private async check(sandboxId: string, hostPath: string, field: string): Promise<void> {
    // Taken before the states are read: a claim that settles meanwhile has written its state first.
    const pending = [...this.inFlight].filter(([id]) => id !== sandboxId);
    const mine = await resolved(hostPath);
    const others = await Promise.all(
      (await this.recorded())
        .filter((other) => other.sandboxId !== sandboxId)
        .map(async (other) => [other.sandboxId, await resolved(other.hostPath)] as const),
    );
    for (const [other, theirs] of [...pending, ...others]) {
      if (mine === theirs || !(isWithin(mine, theirs) || isWithin(theirs, mine))) continue;
      const where = isWithin(mine, theirs) ? 'lies inside' : 'holds';
      throw new StasisError(
        'INVALID_ARGUMENT',
        `${field}: ${JSON.stringify(hostPath)} ${where} the active workspace of sandbox ${other} on this host ` +
          `(${JSON.stringify(theirs)}); a sandbox may rename anything in its workspace, so active workspaces must not nest`,
      );
    }
    this.inFlight.set(sandboxId, mine);
  }
}

/** The path as the host resolves it now, or as written where it cannot be resolved. */
async function resolved(hostPath: string): Promise<string> {
  const written = path.resolve(hostPath);
  return resolveOnHost(written).catch(() => written);
}
