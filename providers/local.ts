import * as fs from 'node:fs/promises';
import { parseOrInvalid, StasisError } from '../common/errors';
import type { Checkpoint, SandboxLimits, Workspace } from '../common/schemas';
import { DEFAULT_ARCHIVE_LIMITS, type ArchiveLimits } from '../stores/archive';
import { hasErrorCode, makeDirDurable } from '../stores/atomic-file';
import { markStage } from '../stores/cas/restore';
import {
  FencedRequest,
  FileRequest,
  ProviderExecRequest,
  ProvisionRequest,
  RestoreRequest,
  SandboxReleaseRequest,
  type Capabilities,
  type ExecOutcome,
  type ProviderDeps,
  type RequestContext,
  type RestoreResult,
  type SandboxProvider,
  type SandboxReleaseReceipt,
} from './api';
import {
  hostCommands,
  SHELL_FROM_STDIN,
  spawnInSandbox,
  SYSTEM_PATH,
  waitForOutcome,
  type CommandWrapper,
} from './command';
import { findExecutable } from './executables';
import { readWorkspaceFile, writeWorkspaceFile } from './files';
import { withLifecycleLock } from './lock';
import { WorkspaceClaims } from './workspace-claims';
import {
  freezeSandbox,
  killSandbox,
  markerEnv,
  sandboxProcesses,
  scanSandboxProcesses,
  thawSandbox,
  type SandboxMarker,
} from './processes';
import { ReceiptStore } from './receipts';
import {
  newGrant,
  readState,
  rotateGrant,
  sandboxesDir,
  sandboxPaths,
  writeState,
  type SandboxPaths,
  type HostSandboxState,
} from './sandbox-state';
import { JobJournal } from './jobs';
import { resolveLimits } from './limits';
import { mountVolume, prepareVolume, removeSandboxDir, unmountVolume } from './volume';
import { checkpointPrefix, recordUnchanged, restoreSnapshot, uploadSnapshot, type Progress } from './snapshot';

// The `local` provider: a sandbox is a set of directories on the worker's host
// and the processes started in them. `bwrap` is this same provider with every
// command wrapped in bubblewrap (see bwrap.ts).

export interface LocalProviderOptions {
  name?: string;
  /** How commands run in a sandbox; the host directly by default. */
  commands?: CommandWrapper;
  /** Limits applied to a checkpoint archive before it is unpacked. */
  archiveLimits?: ArchiveLimits;
  /** Per stream; output beyond it is dropped and the result says so. */
  maxOutputBytes?: number;
}

/**
 * The long-lived process that makes a sandbox's compute "run" between commands: the host's `sleep`,
 * found once in the system PATH (a bwrap sandbox binds the same system directories). Started
 * directly, not through `sh -c 'exec sleep infinity'`: one exec less per start, and the same single
 * process in the sandbox's groups. A host without it in the system PATH keeps the shell.
 */
let initArgv: string[] | undefined;

function initProcess(): string[] {
  if (!initArgv) {
    const sleep = findExecutable('sleep', SYSTEM_PATH.split(':'));
    initArgv = sleep ? [sleep, 'infinity'] : ['/bin/sh', '-c', 'exec sleep infinity'];
  }
  return initArgv;
}

const HEARTBEAT_MS = 2_000;

const CAPABILITIES: Capabilities = {
  pauseModes: ['DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'],
  pause: true,
  crossHostRestore: true,
};

export function createLocalProvider(deps: ProviderDeps, options: LocalProviderOptions = {}): SandboxProvider {
  const name = options.name ?? 'local';
  const commands = options.commands ?? hostCommands;
  const archiveLimits = options.archiveLimits ?? DEFAULT_ARCHIVE_LIMITS;
  const maxOutputBytes = options.maxOutputBytes ?? 1024 * 1024;
  const markerOf = (sandboxId: string): SandboxMarker => ({ sandboxId, hostId: deps.hostId });
  const pathsOf = (sandboxId: string) => sandboxPaths(deps.dataDir, sandboxId);
  const volumes = deps.volumes ?? 'off';
  /** Exec jobs this process is running, by `<sandboxId>/<jobId>`. */
  const runningJobs = new Map<string, Promise<ExecOutcome>>();
  /**
   * What a release (or a restore: its baseline) leaves for after its answer, by sandbox id: writing the next checkpoint's
   * baseline and unmounting the volume (together 15-50 ms of an unchanged re-suspend). Neither is
   * needed for the checkpoint or the receipt; each is done under the lifecycle lock right after the
   * release, or first thing by the sandbox's next call if that comes earlier (`settle`). A worker
   * killed in between loses neither: an older baseline is sound, and host maintenance unmounts the
   * volumes of stopped sandboxes (unmountIdleVolumes).
   */
  const afterReceipt = new Map<string, { paths: SandboxPaths; baseline?: () => Promise<void>; unmount: boolean }>();
  /** The scheduled `settle` calls, which close() waits for. */
  const settling = new Set<Promise<void>>();

  /**
   * Does what the sandbox's last release left. The unmount only when the sandbox is otherwise idle
   * (`idle`): a call that comes first needs the files mounted, or ends by releasing them itself.
   */
  async function settle(sandboxId: string, idle: boolean): Promise<void> {
    const work = afterReceipt.get(sandboxId);
    if (!work) return;
    afterReceipt.delete(sandboxId);
    // Only the next checkpoint's shortcut: a failed write (a sandbox destroyed meanwhile) costs nothing else.
    await work.baseline?.().catch(() => undefined);
    // A failed unmount leaves a mounted volume, which the next call uses or host maintenance unmounts.
    if (idle && work.unmount) await unmountVolume(work.paths).catch(() => undefined);
  }

  /** The lifecycle lock, for a call that first settles what the sandbox's last release left. */
  function locked<T>(sandboxId: string, fn: () => Promise<T>): Promise<T> {
    return withLifecycleLock(sandboxId, async () => {
      await settle(sandboxId, false);
      try {
        return await fn();
      } finally {
        // A provision or restore that claimed an active workspace has written its state, or failed without one.
        claims.settled(sandboxId);
      }
    });
  }

  /** Active workspaces must not nest on this host (workspace-claims.ts); the record is the sandboxes' states. */
  const claims = new WorkspaceClaims(async () => {
    let names: string[];
    try {
      names = await fs.readdir(sandboxesDir(deps.dataDir));
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return [];
      throw err;
    }
    const states = await Promise.all(names.map((id) => readState(pathsOf(id)).catch(() => undefined)));
    return states.flatMap((state) =>
      state?.workspace.kind === 'active' ? [{ sandboxId: state.sandboxId, hostPath: state.workspace.hostPath }] : [],
    );
  }, `workspace-claims:${deps.dataDir}`);

  /** Queues the settling of `sandboxId` behind the current holder of its lock (the release that leaves it). */
  function settleSoon(sandboxId: string): void {
    const done: Promise<void> = withLifecycleLock(sandboxId, () => settle(sandboxId, true))
      .catch(() => undefined)
      .finally(() => settling.delete(done));
    settling.add(done);
  }

  async function load(sandboxId: string): Promise<{ paths: SandboxPaths; state: HostSandboxState }> {
    const paths = pathsOf(sandboxId);
    const state = await readState(paths);
    if (!state) throw new StasisError('NOT_FOUND', `sandbox ${sandboxId} does not exist on host ${deps.hostId}`);
    // Before anything touches the trees: written to an unmounted mount point, files would vanish under the mount.
    await mountVolume(paths);
    return { paths, state };
  }

  /**
   * Runs a state change under the sandbox's lifecycle lock after the fence check
   * (which raises the stored fence); the state is saved afterwards, also when
   * `fn` fails, so a raised fence is never forgotten.
   */
  async function fenced<T>(
    request: FencedRequest,
    operation: string,
    fn: (state: HostSandboxState, paths: SandboxPaths) => Promise<T>,
  ): Promise<T> {
    return locked(request.sandboxId, async () => {
      const { paths, state } = await load(request.sandboxId);
      const loaded = JSON.stringify(state);
      admitFence(state, request.fence, operation);
      try {
        return await fn(state, paths);
      } finally {
        await saveIfChanged(paths, state, loaded);
      }
    });
  }

  /**
   * Writes the state unless it is still what was read (`loaded`, its JSON then): a call that changed
   * nothing (an exec, an attach or a DETACH release at the current fence) costs no write and no fsyncs.
   */
  async function saveIfChanged(paths: SandboxPaths, state: HostSandboxState, loaded: string): Promise<void> {
    if (JSON.stringify(state) !== loaded) await writeState(paths, state);
  }

  /**
   * File access under the lifecycle lock, so it never interleaves with a release, restore or
   * destroy: refused for a superseded owner (its fence) and once compute was released with a
   * snapshot (the files are then a copy of the checkpoint; a write there would be lost).
   */
  async function withFiles<T>(
    request: FileRequest,
    operation: string,
    fn: (paths: SandboxPaths) => Promise<T>,
  ): Promise<T> {
    return locked(request.sandboxId, async () => {
      const { paths, state } = await load(request.sandboxId);
      if (request.fence !== undefined && request.fence < state.maxFence) {
        throw new StasisError(
          'STALE_FENCE',
          `sandbox ${state.sandboxId}: file ${operation} carries fence ${request.fence}, but fence ${state.maxFence} has already been seen`,
        );
      }
      if (state.dormant) {
        throw new StasisError(
          'INVALID_STATE_TRANSITION',
          `sandbox ${state.sandboxId}: its compute was released with a checkpoint; resume it before file ${operation}`,
        );
      }
      return fn(paths);
    });
  }

  function envOf(state: HostSandboxState, extra: Record<string, string> = {}): Record<string, string> {
    return { ...state.env, ...extra, ...markerEnv(markerOf(state.sandboxId)) };
  }

  /** Every process of the sandbox joins its groups and takes its limits. */
  function confinementOf(state: HostSandboxState) {
    return { marker: markerOf(state.sandboxId), limits: resolveLimits(state.limits) };
  }

  /**
   * Starts the init process unless the sandbox still has live processes (a retried call, or compute that survived).
   * Returns the state as written before the start, if it had to be (the caller need not write it again unchanged).
   * A call whose attempt was cancelled (Temporal timed it out and may have retried it on another host) starts
   * nothing: the last point before two hosts could run the sandbox.
   */
  async function ensureCompute(
    state: HostSandboxState,
    paths: SandboxPaths,
    signal: AbortSignal | undefined,
  ): Promise<string | undefined> {
    signal?.throwIfAborted();
    const marker = markerOf(state.sandboxId);
    let written: string | undefined;
    if (state.dormant) {
      // Compute changes the files, so they are no longer a copy of the last checkpoint: written down before it
      // starts. A worker dying after the start, before its caller wrote the state, left a state saying they still
      // were, and the next release returned that checkpoint without looking at the files.
      delete state.dormant;
      if (state.status === 'stopped') state.status = 'running';
      await writeState(paths, state);
      written = JSON.stringify(state);
    }
    if ((await sandboxProcesses(marker)).length > 0) {
      if (state.status === 'paused') await thawSandbox(marker);
    } else {
      await commands.check();
      await spawnInSandbox(commands, paths, initProcess(), {
        env: envOf(state),
        background: true,
        sandbox: confinementOf(state),
      });
    }
    state.status = 'running';
    return written;
  }

  /**
   * Ends the sandbox's compute. A released sandbox holds no mount while it waits (its files are
   * mounted again when next needed): unmounted here, or with `unmountLater` by `settle` after the receipt.
   */
  async function terminate(state: HostSandboxState, unmountLater?: () => void): Promise<void> {
    await killSandbox(markerOf(state.sandboxId));
    if (state.status === 'running' || state.status === 'paused') rotateGrant(state);
    state.status = 'stopped';
    if (unmountLater) unmountLater();
    else await unmountVolume(pathsOf(state.sandboxId));
  }

  async function snapshotAndTerminate(
    state: HostSandboxState,
    paths: SandboxPaths,
    request: SandboxReleaseRequest,
    context: RequestContext,
    later: { baseline?: () => Promise<void>; unmount: boolean },
  ): Promise<Checkpoint> {
    // Nothing ran since the last snapshot: its checkpoint still describes the files exactly.
    if (state.dormant && state.status === 'stopped' && (await deps.store.exists(state.dormant.checkpoint.uri))) {
      later.unmount = true;
      return state.dormant.checkpoint;
    }
    const marker = markerOf(state.sandboxId);
    const wasPaused = state.status === 'paused';
    const labels = context.labels ?? {};
    const progress: Progress = { phase: 'freezing processes', bytes: 0 };
    let checkpoint: Checkpoint | undefined;
    await withHeartbeat(context, progress, async () => {
      try {
        await freezeSandbox(marker);
        checkpoint = await uploadSnapshot({
          store: deps.store,
          paths,
          sandboxId: state.sandboxId,
          fence: request.fence,
          idempotencyKey: request.idempotencyKey,
          labels,
          limits: archiveLimits,
          progress,
          ...(context.signal ? { signal: context.signal } : {}),
          deferBaseline: (write) => (later.baseline = write),
        });
        context.signal?.throwIfAborted();
        progress.phase = 'terminating processes';
        await terminate(state, () => (later.unmount = true));
      } catch (err) {
        // Roll back: the sandbox keeps running as before and no checkpoint is left behind.
        if (checkpoint) await deps.store.delete(checkpoint.uri).catch(() => undefined);
        if (!wasPaused) await thawSandbox(marker);
        throw err;
      }
    });
    if (!checkpoint) throw new StasisError('INTERNAL', `sandbox ${state.sandboxId}: snapshot produced no checkpoint`);
    state.dormant = { checkpoint, labels, since: new Date().toISOString() };
    delete state.restoredFrom;
    return checkpoint;
  }

  /** Creates the directories of a new sandbox; an active workspace is a link to its (created if missing) host path. */
  async function layOut(
    sandboxId: string,
    paths: SandboxPaths,
    workspace: Workspace,
    limits: SandboxLimits | undefined,
  ): Promise<void> {
    // The root first, durably: the two below never race to create it (the loser would not sync its entry). Whoever
    // else creates it (a restore's downloads) does so durably too, and is waited for before the state is written.
    await makeDirDurable(paths.root);
    // The volume's mkfs and the receipts' fsyncs at once; both settle before a failure is thrown.
    const [volume, receipts] = await Promise.allSettled([
      (async () => {
        await prepareVolume(paths, resolveLimits(limits).diskMiB, volumes);
        for (const dir of [paths.home, paths.envs]) await fs.mkdir(dir, { recursive: true });
      })(),
      makeDirDurable(paths.receipts),
    ]);
    if (volume.status === 'rejected') throw volume.reason;
    if (receipts.status === 'rejected') throw receipts.reason;
    if (workspace.kind === 'isolated') {
      await fs.mkdir(paths.workspace, { recursive: true });
      return;
    }
    await claims.claim(sandboxId, workspace.hostPath, 'workspace.hostPath');
    await fs.mkdir(workspace.hostPath, { recursive: true });
    await fs.symlink(workspace.hostPath, paths.workspace).catch((err: unknown) => {
      if (!hasErrorCode(err, 'EEXIST')) throw err;
    });
  }

  function freshState(
    sandboxId: string,
    fence: number,
    workspace: Workspace,
    env: Record<string, string>,
    limits: SandboxLimits | undefined,
  ): HostSandboxState {
    const now = new Date().toISOString();
    return {
      sandboxId,
      hostId: deps.hostId,
      maxFence: fence,
      generation: 0,
      grant: newGrant(),
      status: 'created',
      workspace,
      env,
      ...(limits ? { limits } : {}),
      createdAt: now,
      updatedAt: now,
    };
  }

  async function restoreLocked(request: RestoreRequest, context: RequestContext): Promise<RestoreResult> {
    const paths = pathsOf(request.sandboxId);
    let state = await readState(paths);
    if (state) admitFence(state, request.fence, 'restore');
    if (state) await mountVolume(paths);
    const { checkpoint } = request;
    let result: RestoreResult;
    let baseline: (() => Promise<void>) | undefined;
    /** A restore from the checkpoint: its files on disk and past their racy window (see restoreSnapshot). */
    let ready: Promise<void> = Promise.resolve();
    if (!checkpoint) {
      if (!state) {
        throw new StasisError(
          'NOT_FOUND',
          `sandbox ${request.sandboxId} has no workspace on host ${deps.hostId}; restoring without a checkpoint needs its host-persistent workspace`,
        );
      }
      result = { source: 'workspace' };
    } else if (state?.dormant?.checkpoint.sha256 === checkpoint.sha256) {
      result = { source: 'local-copy', labels: state.dormant.labels };
      // Like an unpacked one: a retried restore of this checkpoint must not unpack it over what ran since.
      state.restoredFrom = { sha256: checkpoint.sha256, labels: state.dormant.labels };
      // The files are that checkpoint's until a process of the sandbox runs: the next release may repeat
      // it if nothing on the volume changes meanwhile. Only an optimisation: a failure leaves the walk.
      if (state.status === 'stopped' && (await sandboxProcesses(markerOf(state.sandboxId))).length === 0) {
        await recordUnchanged(paths, state.dormant.checkpoint.uri).catch(() => undefined);
      }
    } else if (state?.restoredFrom?.sha256 === checkpoint.sha256 && state.status !== 'stopped') {
      // A retried restore: the files were restored and have been running since; unpacking again would lose work.
      result = { source: 'checkpoint', labels: state.restoredFrom.labels };
    } else {
      const workspace = request.workspace ?? state?.workspace ?? { kind: 'isolated' };
      const existing = state;
      if (existing) await terminate(existing);
      // No state, yet compute: an earlier attempt killed after starting it, before the state recorded the restore
      // (the sync runs meanwhile). Adopted, it would keep running on the tree this restore swaps out.
      else if ((await sandboxProcesses(markerOf(request.sandboxId))).length > 0)
        await killSandbox(markerOf(request.sandboxId));
      const restoring =
        existing ?? freshState(request.sandboxId, request.fence, workspace, request.env ?? {}, request.limits);
      // The volume is made while the checkpoint downloads (restoreSnapshot writes nothing on it before).
      const volumeReady = layOut(request.sandboxId, paths, workspace, restoring.limits).then(() =>
        markStage('volume ready'),
      );
      volumeReady.catch(() => undefined); // awaited by restoreSnapshot, which settles only after it
      try {
        markStage('old compute ended');
        const progress: Progress = { phase: 'restoring', bytes: 0 };
        const restored = await withHeartbeat(context, progress, () =>
          restoreSnapshot({
            store: deps.store,
            checkpoint,
            paths,
            workspace,
            limits: archiveLimits,
            progress,
            volumeReady,
            deferBaseline: (write) => (baseline = write),
            beforeSwap: async () => {
              if (!existing?.dormant) return;
              // A restore killed from here on leaves files that are no local copy of that checkpoint any more.
              delete existing.dormant;
              await writeState(paths, existing);
            },
            ...(context.signal ? { signal: context.signal } : {}),
          }),
        );
        const { labels } = restored;
        ready = restored.ready;
        restoring.restoredFrom = { sha256: checkpoint.sha256, labels };
        result = { source: 'checkpoint', labels };
      } catch (err) {
        // A sandbox that was only being brought here leaves nothing behind; an existing one keeps its raised fence.
        await volumeReady.catch(() => undefined);
        if (existing) await writeState(paths, existing);
        else await removeSandboxDir(paths);
        throw err;
      }
      state = restoring;
    }
    if (request.env) state.env = request.env;
    if (request.limits) state.limits = request.limits;
    markStage('files in place');
    // The sandbox starts while the restored files are synced and their racy window passes (it runs nothing on them
    // before this returns); the state records the restore only once they are on disk.
    const [started, onDisk] = await Promise.allSettled([ensureCompute(state, paths, context.signal), ready]);
    if (onDisk.status === 'rejected') {
      // Nothing records this restore, so the compute started meanwhile must not outlive it: a retry of a new
      // sandbox has no state to terminate it by and would adopt it, running on the tree the retry swaps out.
      await killSandbox(markerOf(request.sandboxId));
      throw onDisk.reason;
    }
    if (started.status === 'rejected') throw started.reason;
    markStage('sandbox started and files ready');
    // A resume from the local copy wrote it already, before the start.
    await saveIfChanged(paths, state, started.value ?? '');
    markStage('state written');
    if (baseline) {
      // The next checkpoint's baseline is written after the answer, as a release's is (see afterReceipt).
      afterReceipt.set(request.sandboxId, { paths, baseline, unmount: false });
      settleSoon(request.sandboxId);
    }
    return result;
  }

  const provider: SandboxProvider = {
    apiVersion: 3,
    name,
    capabilities: CAPABILITIES,
    destroyDeletesCheckpoints: true,

    async provision(raw) {
      const request = parseOrInvalid(ProvisionRequest, raw, 'provision request');
      await commands.check();
      await locked(request.sandboxId, async () => {
        const paths = pathsOf(request.sandboxId);
        const existing = await readState(paths);
        if (existing) {
          // Before the fence: the other provisioning's fences say nothing about this one.
          if (existing.provisionedBy !== request.provisionId) {
            throw new StasisError(
              'INVALID_STATE_TRANSITION',
              `sandbox ${request.sandboxId} already exists on host ${deps.hostId}, provisioned for another Run or sandbox of that id: its workspace is not handed over`,
            );
          }
          admitFence(existing, request.fence, 'provision');
        }
        const state =
          existing ??
          freshState(
            request.sandboxId,
            request.fence,
            request.workspace ?? { kind: 'isolated' },
            request.env ?? {},
            request.limits,
          );
        if (request.provisionId) state.provisionedBy = request.provisionId;
        if (request.template) state.template = request.template;
        await layOut(request.sandboxId, paths, state.workspace, state.limits);
        await writeState(paths, state);
      });
    },

    async attach(raw, context) {
      const request = parseOrInvalid(FencedRequest, raw, 'attach request');
      await locked(request.sandboxId, async () => {
        const { paths, state } = await load(request.sandboxId);
        const loaded = JSON.stringify(state);
        admitFence(state, request.fence, 'attach');
        await saveIfChanged(paths, state, loaded);
        if (state.status !== 'stopped') return;
        // An attach is a resume whose record says the compute lives. A release that landed after the record
        // stopped waiting for it (a stale attempt that held the lock) ended it: it comes back as a same-host
        // restore brings it back, from the dormant copy or the host-persistent workspace, so the record holds.
        if (!state.dormant && state.workspace.kind !== 'active') {
          throw new StasisError(
            'INVALID_STATE_TRANSITION',
            `sandbox ${state.sandboxId} is stopped on host ${deps.hostId} with no copy a release left; attach does not start it`,
          );
        }
        const checkpoint = state.dormant?.checkpoint;
        await restoreLocked(
          { sandboxId: request.sandboxId, fence: request.fence, ...(checkpoint ? { checkpoint } : {}) },
          context,
        );
      });
    },

    async start(raw, context) {
      await fenced(parseOrInvalid(FencedRequest, raw, 'start request'), 'start', async (state, paths) => {
        await ensureCompute(state, paths, context?.signal);
      });
    },

    async exec(raw, context) {
      const request = parseOrInvalid(ProviderExecRequest, raw, 'exec request');
      const key = `${request.sandboxId}/${request.jobId}`;
      // The outcome is wrapped: returned bare, the lock would be held until the command ends.
      const { outcome } = await fenced(
        request,
        'exec',
        async (state, paths): Promise<{ outcome: Promise<ExecOutcome> }> => {
          // A retry that arrives while this process still runs the job waits for the same outcome.
          const inFlight = runningJobs.get(key);
          if (inFlight) return { outcome: inFlight };
          const journal = new JobJournal(paths.jobs);
          const known = await journal.lookup(request);
          if (known.kind === 'finished') return { outcome: Promise.resolve(known.outcome) };
          if (state.status !== 'running') {
            throw new StasisError(
              'INVALID_STATE_TRANSITION',
              state.status === 'paused'
                ? `sandbox ${state.sandboxId} is paused; resume it before exec`
                : `sandbox ${state.sandboxId} is not running (${state.status}); start or restore it before exec`,
            );
          }
          await journal.begin(request);
          // Admitted and started under the lock, so no release can slip between the check and the spawn.
          const child = await spawnInSandbox(commands, paths, SHELL_FROM_STDIN, {
            env: envOf(state, { ...request.env, STASIS_JOB_ID: request.jobId }),
            sandbox: confinementOf(state),
            stdin: request.command,
            maxOutputBytes,
          }).catch(async (err: unknown) => {
            await journal.forget(request); // nothing ran
            throw err;
          });
          // Listening starts right away: a quick command can exit before the lock is released.
          const running = waitForOutcome(child, {
            ...(request.timeoutMs ? { timeoutMs: request.timeoutMs } : {}),
            ...(context.signal ? { signal: context.signal } : {}),
          });
          const grant = state.grant;
          // Under the lock: a release that killed the command has finished recording it by then, and a destroy
          // has removed the sandbox; its journal is then not written (that would bring back its directory).
          const recordEnd = (end: (after: HostSandboxState | undefined) => Parameters<JobJournal['finish']>[1]) =>
            withLifecycleLock(request.sandboxId, async () => {
              const after = await readState(paths).catch(() => undefined);
              const result = end(after);
              if (after) await journal.finish(request, result).catch(() => undefined);
            });
          const finishing = (async () => {
            try {
              const result = await running;
              await recordEnd((after) => {
                if (after?.grant !== grant) {
                  result.stderr += `${result.stderr ? '\n' : ''}[stasis: the sandbox's compute was released while the command ran]`;
                }
                return { outcome: result };
              }).catch(() => undefined);
              return result;
            } catch (err) {
              await recordEnd(() => ({ error: String(err) })).catch(() => undefined);
              throw err;
            } finally {
              runningJobs.delete(key);
            }
          })();
          finishing.catch(() => undefined); // awaited below; this only keeps an early rejection from counting as unhandled
          runningJobs.set(key, finishing);
          return { outcome: finishing };
        },
      );
      return withHeartbeat(context, { phase: `running job ${request.jobId}`, bytes: 0 }, () => outcome);
    },

    async stop(raw) {
      await fenced(parseOrInvalid(FencedRequest, raw, 'stop request'), 'stop', (state) => terminate(state));
    },

    async pause(raw) {
      await fenced(parseOrInvalid(FencedRequest, raw, 'pause request'), 'pause', async (state) => {
        if (state.status !== 'running' && state.status !== 'paused') {
          throw new StasisError(
            'INVALID_STATE_TRANSITION',
            `sandbox ${state.sandboxId} is ${state.status}; only a running sandbox can be paused`,
          );
        }
        await freezeSandbox(markerOf(state.sandboxId));
        state.status = 'paused';
      });
    },

    async resume(raw) {
      await fenced(parseOrInvalid(FencedRequest, raw, 'resume request'), 'resume', async (state) => {
        if (state.status !== 'running' && state.status !== 'paused') {
          throw new StasisError(
            'INVALID_STATE_TRANSITION',
            `sandbox ${state.sandboxId} is ${state.status}; only a paused sandbox can be resumed`,
          );
        }
        await thawSandbox(markerOf(state.sandboxId));
        state.status = 'running';
      });
    },

    async restore(raw, context) {
      const request = parseOrInvalid(RestoreRequest, raw, 'restore request');
      return locked(request.sandboxId, () => restoreLocked(request, context));
    },

    async destroy(raw) {
      const request = parseOrInvalid(FencedRequest, raw, 'destroy request');
      await locked(request.sandboxId, async () => {
        const paths = pathsOf(request.sandboxId);
        const state = await readState(paths);
        // No state here: already destroyed (destroy is idempotent), or its copy was evicted; its checkpoints still go.
        if (state) {
          admitFence(state, request.fence, 'destroy');
          await killSandbox(markerOf(request.sandboxId));
          // An active workspace is only a link here: removing it leaves the host's files alone. A process that
          // outlived the kill may still swap a directory for a link to the host: nothing inside is followed.
          await removeSandboxDir(paths);
        }
        // A destroyed sandbox is never restored: every checkpoint it had is garbage now.
        await deps.store.deletePrefix(checkpointPrefix(request.sandboxId));
      });
    },

    async readFile(raw) {
      const request = parseOrInvalid(FileRequest, raw, 'file request');
      return withFiles(request, 'read', (paths) => readWorkspaceFile(paths.workspace, request.path));
    },

    async writeFile(raw) {
      const request = parseOrInvalid(FileRequest, raw, 'file request');
      await withFiles(request, 'write', (paths) => writeWorkspaceFile(paths.workspace, request.path, raw.content));
    },

    async release(raw, context) {
      const request = parseOrInvalid(SandboxReleaseRequest, raw, 'release request');
      return locked(request.sandboxId, async () => {
        const paths = pathsOf(request.sandboxId);
        const receipts = new ReceiptStore(paths.receipts);
        const duplicate = await receipts.replay(request);
        if (duplicate) return duplicate;
        const { state } = await load(request.sandboxId);
        const loaded = JSON.stringify(state);
        admitFence(state, request.fence, 'release');
        let checkpoint: Checkpoint | undefined;
        const later: { baseline?: () => Promise<void>; unmount: boolean } = { unmount: false };
        try {
          if (request.mode === 'TERMINATE') await terminate(state, () => (later.unmount = true));
          if (request.mode === 'SNAPSHOT_AND_TERMINATE')
            checkpoint = await snapshotAndTerminate(state, paths, request, context, later);
        } catch (err) {
          await saveIfChanged(paths, state, loaded);
          throw err;
        }
        const receipt: SandboxReleaseReceipt = {
          sandboxId: request.sandboxId,
          idempotencyKey: request.idempotencyKey,
          mode: request.mode,
          computeReleased: request.mode !== 'DETACH',
          duplicate: false,
          ...(checkpoint ? { checkpoint } : {}),
          fence: request.fence,
          releasedAt: new Date().toISOString(),
        };
        // Only a finished release leaves a receipt, so a failed one is simply retried. The receipt is written
        // and synced while the state (its raised fence) is saved, and named only once that is durable: a
        // receipt never stands for a release whose fence a crash could forget. One fsync less on the path.
        const [saved, staged] = await Promise.allSettled([
          saveIfChanged(paths, state, loaded),
          receipts.stage(request, receipt),
        ]);
        if (saved.status === 'rejected' || staged.status === 'rejected') {
          if (staged.status === 'fulfilled') await staged.value.abort();
          throw saved.status === 'rejected' ? saved.reason : (staged as PromiseRejectedResult).reason;
        }
        await staged.value.commit();
        // Left only by a release that stands: a failed one rolled back (no checkpoint, compute kept).
        if (later.baseline || later.unmount) {
          afterReceipt.set(request.sandboxId, { paths, ...later });
          settleSoon(request.sandboxId);
        }
        return receipt;
      });
    },

    async processCount(sandboxId) {
      return (await sandboxProcesses(markerOf(sandboxId))).length;
    },

    async listSandboxes() {
      const dir = sandboxesDir(deps.dataDir);
      let names: string[];
      try {
        names = await fs.readdir(dir);
      } catch (err) {
        if (hasErrorCode(err, 'ENOENT')) return [];
        throw err;
      }
      const processes = await scanSandboxProcesses(deps.hostId);
      const found: { sandboxId: string; alive: boolean; dormant: boolean }[] = [];
      for (const sandboxId of names) {
        // Anything that is not a readable sandbox (a stray file, a half-deleted directory) is not listed.
        const state = await Promise.resolve()
          .then(() => readState(pathsOf(sandboxId)))
          .catch(() => undefined);
        if (!state) continue;
        found.push({
          sandboxId,
          alive: (processes.get(sandboxId)?.length ?? 0) > 0,
          dormant: state.dormant !== undefined,
        });
      }
      return found;
    },

    async close() {
      // No client handles to close, and closing never touches compute; what releases left is finished.
      await Promise.all([...settling]);
    },
  };
  return provider;
}

/** Refuses a call whose fence is below the highest seen for the sandbox; a higher one becomes the new highest. */
function admitFence(state: HostSandboxState, fence: number, operation: string): void {
  if (fence < state.maxFence) {
    throw new StasisError(
      'STALE_FENCE',
      `sandbox ${state.sandboxId}: ${operation} carries fence ${fence}, but fence ${state.maxFence} has already been seen`,
    );
  }
  state.maxFence = fence;
}

/** Heartbeats with `progress` while `fn` runs, so Temporal sees a long call is alive. */
async function withHeartbeat<T>(context: RequestContext, progress: Progress, fn: () => Promise<T>): Promise<T> {
  const beat = () => context.heartbeat?.({ ...progress });
  beat();
  const timer = setInterval(beat, HEARTBEAT_MS);
  try {
    return await fn();
  } finally {
    clearInterval(timer);
  }
}
