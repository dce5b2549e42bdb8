import { mkdir } from 'node:fs/promises';
import type { Client } from '@temporalio/client';
import type { Config } from '../common/config';
import { END_REASON } from '../common/errors';
import { RUN_SANDBOX_SUFFIX } from '../common/wire-checks';
import { evictUnderPressure, orphanSweep, unmountIdleVolumes } from '../providers/maintenance';
import type { ProviderRegistry } from '../providers/registry';
import { sandboxesDir } from '../providers/sandbox-state';
import type { ExecutionResourceRecord } from '../common/schemas';
import type { CheckpointStore } from '../stores/api';
import { reconcileSignal, resourceQuery, sandboxQuery, sandboxWorkflowId } from '../workflows/definitions';
import { SANDBOX_TRANSITIONS } from '../workflows/lifecycle';

// Host maintenance on each worker: reconcile after a restart, and the sweep of
// dormant workspace copies that no live record points at.

export interface HostContext {
  registry: ProviderRegistry;
  client: Client;
  hostId: string;
}

/** The workflow that owns a sandbox id: a Run's sandbox is `<runId>-sbx`, a standalone one `sandbox-<id>`. */
function ownerOf(sandboxId: string): { kind: 'run' | 'sandbox'; workflowId: string } {
  return sandboxId.endsWith(RUN_SANDBOX_SUFFIX)
    ? { kind: 'run', workflowId: sandboxId.slice(0, -RUN_SANDBOX_SUFFIX.length) }
    : { kind: 'sandbox', workflowId: sandboxWorkflowId(sandboxId) };
}

/**
 * After a restart: sandboxes whose processes died are reported so their workflow marks them `lost`, and so are
 * those whose record names this host but that it has no copy of (a machine replaced under the same host id, with
 * an empty disk). Runs are not reported: their workflow has no reconcile handler.
 */
export async function reconcileHost({ registry, client, hostId, taskQueue }: ReconcileContext): Promise<void> {
  const report = (workflowId: string, alive: boolean) =>
    client.workflow
      .getHandle(workflowId)
      .signal(reconcileSignal, { hostId, alive })
      .catch(() => undefined);
  // Listed before the disk is read, so a sandbox that reaches this host meanwhile is on the disk when it is read.
  const named = await sandboxesNaming(client, hostId, taskQueue).catch((err: unknown) => {
    console.warn(`reconcile on ${hostId} could not list the sandboxes whose record names it: ${String(err)}`);
    return [];
  });
  const here = new Set<string>();
  for (const provider of registry.names().map((name) => registry.get(name))) {
    for (const sandbox of await provider.listSandboxes()) {
      here.add(sandbox.sandboxId);
      if (sandbox.dormant) continue;
      const owner = ownerOf(sandbox.sandboxId);
      if (owner.kind !== 'sandbox') continue;
      await report(owner.workflowId, sandbox.alive);
    }
  }
  for (const sandboxId of named) if (!here.has(sandboxId)) await report(sandboxWorkflowId(sandboxId), false);
}

export interface ReconcileContext extends HostContext {
  /** The workflows' task queue: other deployments in the namespace may use the same host ids. */
  taskQueue: string;
}

/**
 * The standalone sandboxes (of the workflows on `taskQueue`) whose record names `hostId`, through visibility, in
 * a state a host can lose them from. The workflow still decides: it ignores a report once its record names another
 * host, or while it changes state (provisioning, restoring).
 */
async function sandboxesNaming(client: Client, hostId: string, taskQueue: string): Promise<string[]> {
  const states = SANDBOX_TRANSITIONS.lose.from.map((state) => `StasisStatus = '${state}'`).join(' OR ');
  const query = [
    `StasisKind = 'sandbox'`,
    `ExecutionStatus = 'Running'`,
    `TaskQueue = '${taskQueue}'`,
    `StasisHostId = '${hostId}'`,
    `(${states})`,
  ].join(' AND ');
  const prefix = sandboxWorkflowId('');
  const found: string[] = [];
  for await (const workflow of client.workflow.list({ query })) {
    if (workflow.workflowId.startsWith(prefix)) found.push(workflow.workflowId.slice(prefix.length));
  }
  return found;
}

/** Whether a live record on this host still names the sandbox's directory. */
export async function isLiveHere(client: Client, hostId: string, sandboxId: string): Promise<boolean> {
  const owner = ownerOf(sandboxId);
  const handle = client.workflow.getHandle(owner.workflowId);
  try {
    const description = await handle.describe();
    if (description.status.name !== 'RUNNING') return false;
    if (owner.kind === 'run') return (await handle.query(resourceQuery)).record.hostId === hostId;
    const view = await handle.query(sandboxQuery);
    return view.record.hostId === hostId && view.error?.code !== END_REASON.SUSPEND_EXPIRED;
  } catch (err) {
    // Unknown workflow: nothing names it. Anything else (Temporal down): keep the directory.
    return !(err instanceof Error && err.name === 'WorkflowNotFoundError');
  }
}

/**
 * Runs one sandbox's Temporal calls under a signal of their own that `signal` aborts. The SDK's client
 * adds an 'abort' listener holding the call to the signal in scope for every call and never removes it:
 * under the pass's signal, a pass over 10,000 sandboxes kept its 20,000 to 40,000 calls until it ended.
 */
async function callsUnder<T>(client: Client, signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T> {
  if (!signal) return fn();
  signal.throwIfAborted();
  const own = new AbortController();
  const abort = () => own.abort(signal.reason);
  signal.addEventListener('abort', abort, { once: true });
  try {
    return await client.withAbortSignal(own.signal, fn);
  } finally {
    signal.removeEventListener('abort', abort);
  }
}

/** Statuses of an owner workflow that has ended: nothing of it acts on its sandbox any more. */
const ENDED = new Set(['COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT']);

/** Record states in which the record's host is moving compute in or out: another host may not judge them. */
const MOVING = new Set<ExecutionResourceRecord['state']>(['PROVISIONING', 'RESTORING']);

/** What maintenance knows of one sandbox of this host and its owner. */
export interface SandboxFacts {
  hostId: string;
  sandboxId: string;
  /** Processes of the sandbox run on this host. */
  alive: boolean;
  /** The owner workflow's status (Temporal's name: RUNNING, COMPLETED, ...). */
  status: string;
  record: ExecutionResourceRecord;
  /** A standalone sandbox suspended past its retention: it stays only to answer stale. */
  expired: boolean;
}

/**
 * What maintenance does with one sandbox of this host, from its owner:
 * - `remove`: the owner is done with it and its record says DESTROYED (the owner has ended, or it is a
 *   standalone sandbox past retention, which stays only to answer stale): processes, directory and
 *   checkpoints go.
 * - `stop`: processes run here that nothing uses: the owner has ended without releasing the sandbox's
 *   compute (terminated or timed out in Temporal, or it kept a sandbox it could not snapshot), or the
 *   owner's record puts the sandbox on another host and is not moving it (a provision or restore attempt
 *   here that outlived its timeout while a retry went elsewhere: two hosts would run it). The workspace stays.
 * - undefined (keep): anything else.
 */
export function verdictFor(facts: SandboxFacts): 'remove' | 'stop' | undefined {
  const { record, status, alive } = facts;
  if (record.sandboxId !== facts.sandboxId) return undefined;
  const ended = ENDED.has(status);
  if (record.state === 'DESTROYED' && (ended || facts.expired)) return 'remove';
  if (!alive) return undefined;
  if (ended) return 'stop';
  const elsewhere = record.hostId !== undefined && record.hostId !== facts.hostId;
  return status === 'RUNNING' && elsewhere && !MOVING.has(record.state) ? 'stop' : undefined;
}

/** The facts of one sandbox of this host (undefined: an unknown owner or Temporal unreachable, so keep it). */
async function factsOf(
  client: Client,
  hostId: string,
  sandboxId: string,
  alive: boolean,
): Promise<SandboxFacts | undefined> {
  const owner = ownerOf(sandboxId);
  const handle = client.workflow.getHandle(owner.workflowId);
  try {
    const status = (await handle.describe()).status.name;
    // A running Run acts on its own sandbox: only compute running here matters (whose host the record may not be).
    if (owner.kind === 'run' && status === 'RUNNING' && !alive) return undefined;
    if (owner.kind === 'run')
      return { hostId, sandboxId, alive, status, record: (await handle.query(resourceQuery)).record, expired: false };
    const view = await handle.query(sandboxQuery);
    return {
      hostId,
      sandboxId,
      alive,
      status,
      record: view.record,
      expired: view.error?.code === END_REASON.SUSPEND_EXPIRED,
    };
  } catch {
    return undefined;
  }
}

/**
 * Sandboxes on this host whose owner was destroyed while this host was gone or failing (its record
 * says DESTROYED, its workflow has ended) are removed now, through the provider that made them; the
 * processes of sandboxes nothing uses (an owner that ended without releasing them, or whose record puts
 * the sandbox on another host) are stopped (see verdictFor). One sandbox's failure is logged and does
 * not hold up the others.
 */
export async function settleEnded(
  { registry, client, hostId }: HostContext,
  signal?: AbortSignal,
): Promise<{ removed: string[]; stopped: string[] }> {
  const seen = new Set<string>();
  const removed: string[] = [];
  const stopped: string[] = [];
  for (const provider of registry.names().map((name) => registry.get(name))) {
    for (const { sandboxId, alive } of await provider.listSandboxes()) {
      signal?.throwIfAborted();
      if (seen.has(sandboxId)) continue;
      seen.add(sandboxId);
      const facts = await callsUnder(client, signal, () => factsOf(client, hostId, sandboxId, alive));
      const verdict = facts && verdictFor(facts);
      if (!facts || !verdict) continue;
      const { record, status } = facts;
      const request = { sandboxId, fence: record.fence };
      const context = { ownerId: ownerOf(sandboxId).workflowId, hostId };
      try {
        if (verdict === 'remove') {
          await registry.get(record.provider).destroy(request, context);
          removed.push(sandboxId);
        } else {
          await registry.get(record.provider).stop(request, context);
          stopped.push(sandboxId);
          const why =
            status === 'RUNNING'
              ? `its owner ${context.ownerId} has it on host ${record.hostId} (${record.state})`
              : `its owner ${context.ownerId} has ended (${status}) with its record ${record.state}`;
          console.warn(
            `host maintenance on ${hostId} stopped the processes of sandbox ${sandboxId}: ${why}; the workspace stays on this host`,
          );
        }
      } catch (err) {
        signal?.throwIfAborted();
        console.warn(`host maintenance on ${hostId} could not ${verdict} sandbox ${sandboxId}: ${String(err)}`);
      }
    }
  }
  return { removed, stopped };
}

export interface MaintenanceOptions extends HostContext {
  config: Config;
  /** This host's data directory (`<STASIS_DATA_DIR>/hosts/<hostId>`). */
  dataDir: string;
  store: CheckpointStore;
}

/**
 * One maintenance pass: what destroy left behind and compute an ended owner left running, orphaned dormant
 * copies, disk pressure, then idle mounts.
 */
export async function maintainHost(options: MaintenanceOptions, now?: () => Date, signal?: AbortSignal) {
  const dir = sandboxesDir(options.dataDir);
  await mkdir(dir, { recursive: true });
  const { removed: destroyed, stopped } = await settleEnded(options, signal);
  const orphans = await orphanSweep({
    sandboxesDir: dir,
    isLive: (sandboxId) => {
      signal?.throwIfAborted();
      return callsUnder(options.client, signal, () => isLiveHere(options.client, options.hostId, sandboxId));
    },
    ttlSeconds: options.config.STASIS_ORPHAN_DORMANT_DIR_TTL_SECONDS,
    ...(now ? { now } : {}),
  });
  const eviction = await evictUnderPressure({
    sandboxesDir: dir,
    minFreeBytes: options.config.STASIS_DISK_MIN_FREE_MB * 1024 * 1024,
    checkpointExists: (uri) => options.store.exists(uri),
  });
  const unmounted = await unmountIdleVolumes(dir);
  return { destroyed, stopped, orphans, eviction, unmounted };
}

/**
 * Runs maintainHost every `intervalMs` until the returned function is called. That function cancels the
 * Temporal calls of a pass in flight, stops it before its next sandbox, and resolves once it has ended, so the worker closes its
 * connection after the pass's last call: a call retried after the close threw "Channel has been shut
 * down" outside any caller and failed the process.
 */
export function startMaintenance(options: MaintenanceOptions, intervalMs = 60_000): () => Promise<void> {
  let stopped = false;
  let current: AbortController | undefined;
  let pass: Promise<void> | undefined;
  const timer = setInterval(() => {
    if (pass || stopped) return;
    // A signal per pass, dropped with it: the SDK's client hangs an 'abort' listener holding the call on the
    // signal in scope for every call and never removes it. One signal for the worker's life kept every call of
    // every pass, 2 to 4 per sandbox each minute (heap snapshots: 21 KiB per waiting Run within 4 minutes).
    const controller = new AbortController();
    current = controller;
    pass = options.client
      .withAbortSignal(controller.signal, () => maintainHost(options, undefined, controller.signal))
      .then(
        () => undefined,
        (err: unknown) => {
          if (!controller.signal.aborted) console.warn(`host maintenance on ${options.hostId} failed: ${String(err)}`);
        },
      )
      .finally(() => {
        pass = undefined;
        current = undefined;
      });
  }, intervalMs);
  timer.unref();
  return async () => {
    stopped = true;
    clearInterval(timer);
    current?.abort();
    await pass;
  };
}
