import { randomUUID } from 'node:crypto';
import { Client, Connection, WorkflowIdReusePolicy, type WorkflowHandle } from '@temporalio/client';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import { parseOrInvalid, StasisError } from '../common/errors';
import { z } from 'zod';
import {
  activeWorkspacesOfRun,
  activeWorkspacesOfSandbox,
  checkHostPaths,
  type HostPathPolicy,
} from '../common/host-paths';
import {
  DEFAULT_TEMPORAL_NAMESPACE,
  temporalConnectConfig,
  type TemporalConnectionOptions,
} from '../common/temporal-connection';
import { setTimeout as sleep } from 'node:timers/promises';
import { ACTION_WAIT_MS, actionBodyHash } from '../common/external-actions';
import {
  ActionRequest,
  ActionWaitMs,
  type ActionView,
  ClientIdentity,
  CreateSandboxInput,
  ExecInput,
  Identifier,
  InteractionResponse,
  RunId,
  RespondInput,
  RunListLimit,
  RunSpec,
  RunStatus,
  type ExecResult,
  type InteractionRequest,
  type MetricsSnapshot,
  type PendingInteraction,
  type ResourceView,
  type RunSnapshot,
  type SandboxView,
  SandboxListFilter as SandboxListFilterSchema,
  type SandboxListFilter,
  type SandboxPage,
} from '../common/schemas';
import { checkNamespace } from '../common/config';
import {
  DEFAULT_SUSPENDED_RETENTION_SECONDS,
  DEFAULT_TASK_QUEUE,
  QUEUE_NAME,
  QUEUE_NAME_RULE,
} from '../common/defaults';
import { FILE_LIMIT_BYTES, inputTooLarge } from '../common/payload-limits';
import { jsonValueProblem } from '../common/wire-json';
import { canonicalJson } from '../common/hashes';
import {
  actionQuery,
  actUpdate,
  destroySandboxUpdate,
  execSandboxUpdate,
  pauseSandboxUpdate,
  readFileUpdate,
  resourceQuery,
  respondSignal,
  respondUpdate,
  resumeRunUpdate,
  resumeSandboxUpdate,
  sandboxQuery,
  sandboxReadyUpdate,
  sandboxWorkflowId,
  snapshotQuery,
  startSandboxUpdate,
  stopSandboxUpdate,
  suspendRunUpdate,
  suspendSandboxUpdate,
  writeFileUpdate,
} from '../workflows/definitions';
import type { runWorkflow, sandboxWorkflow } from '../workflows';
import { forgetContent, isTerminal } from '../workflows/run-state';
import { checkRespond } from '../workflows/lifecycle';
import { labelKeywords } from '../common/labels';
import {
  StasisKind,
  StasisLabels,
  StasisPendingInteractions,
  StasisProvider,
  StasisStatus,
  StasisResourceState,
} from '../workflows/search-attributes';
import { PENDING_MEMO } from '../common/interactions';
import { compareCursors, decodeCursor, encodeCursor, type Cursor } from './cursor';
import { listSandboxes } from './sandbox-list';
import { grpcErrorOf, isClosedWorkflow, refusedByClosedRun, toStasisError } from './errors';
import { actionEndedOutside, closeReason, endedOutside, isSettled, workflowClosed } from './closed-run';
import { sendUpdate } from './updates';
import { collectMetrics, type WorkerMetricsSource } from './metrics';
import { OwnedWorkflows } from './owned-workflows';

export { StasisError } from '../common/errors';

/**
 * `value` as JSON first, as REST's body parser takes it (JSON at all: no BigInt, function, symbol,
 * NaN, Infinity or circular object; well-formed Unicode; bounded nesting; no `__proto__` key, which
 * zod's records and objects would drop silently), then parsed by `schema` (INVALID_ARGUMENT naming
 * each bad field), and no larger than
 * JSON_INPUT_LIMIT_BYTES as JSON (PAYLOAD_TOO_LARGE): what the REST API accepts, and what Temporal can carry.
 */
function checkedInput<S extends z.ZodType>(schema: S, value: unknown, what: string): z.infer<S> {
  const problem = jsonValueProblem(value, what);
  if (problem) throw new StasisError('INVALID_ARGUMENT', problem);
  const valid = parseOrInvalid(schema, value, what);
  const tooLarge = inputTooLarge(what, valid);
  if (tooLarge) throw new StasisError('PAYLOAD_TOO_LARGE', tooLarge);
  return valid;
}

/** `value` in a refusal: as JSON, a long string cut to 64 characters. */
function shown(value: string): string {
  return JSON.stringify(value.length > 64 ? `${value.slice(0, 64)}…` : value);
}

/** A plain-JS caller's argument that is not a string: INVALID_ARGUMENT naming it, not a TypeError later. */
function checkString(value: unknown, field: string): asserts value is string {
  if (typeof value !== 'string')
    throw new StasisError(
      'INVALID_ARGUMENT',
      `${field}: must be a string (got ${value === null ? 'null' : typeof value})`,
    );
}

/** An id (sandbox, interaction, action) as REST's routes take it (Identifier); Temporal would answer NOT_FOUND or INTERNAL. */
function checkId(id: unknown, field: string): asserts id is string {
  checkString(id, field);
  const parsed = Identifier.safeParse(id);
  if (parsed.success) return;
  const problems = parsed.error.issues.map((issue) => issue.message).join('; ');
  throw new StasisError('INVALID_ARGUMENT', `${field} ${shown(id)}: not an id (${problems})`);
}

/**
 * Refuses an id no Run can have before Temporal is asked: Temporal would answer an empty or
 * oversized workflow id with an opaque failure (INTERNAL), and a sandbox's workflow id with
 * whatever that workflow answers to a Run's query or Update.
 */
function checkRunId(runId: unknown): void {
  checkString(runId, 'runId');
  const parsed = RunId.safeParse(runId);
  if (parsed.success) return;
  // A sandbox's workflow id is a well-formed id that names no Run (a RunSpec may not take one).
  if (Identifier.safeParse(runId).success) throw new StasisError('NOT_FOUND', `run ${runId} not found`);
  const problems = parsed.error.issues.map((issue) => issue.message).join('; ');
  throw new StasisError('INVALID_ARGUMENT', `runId ${shown(runId)}: not a Run id (${problems})`);
}

/** An options or filter argument: an object (a plain-JS null would be a TypeError on its first field). */
function checkObject(value: unknown, field: string): void {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw new StasisError('INVALID_ARGUMENT', `${field}: must be an object`);
}

/**
 * The visibility clause of a Run status. A Run whose workflow Temporal closed without the Run's end
 * (terminated, timed out) last published a live status but reads FAILED (see get): FAILED finds it too.
 */
function statusClause(status: RunStatus): string {
  const clause = `StasisStatus = '${status}'`;
  return status === 'FAILED' ? `(${clause} OR ExecutionStatus = 'Terminated' OR ExecutionStatus = 'TimedOut')` : clause;
}

/** A list's `limit`, when given, is a whole number within the bounds REST takes too. */
function checkLimit(limit: number | undefined): void {
  if (limit !== undefined) parseOrInvalid(RunListLimit, limit, 'limit');
}

/** respond's and respondBySignal's options: respondedBy as the wire takes it, updateId an id. */
const RespondOptions = z.object({ respondedBy: RespondInput.shape.respondedBy, updateId: Identifier.optional() });
/** act's options: a wait within REST's bound (NaN or a string would wait forever or not at all). */
const ActOptions = z.object({ waitMs: ActionWaitMs.optional(), inputName: z.string().optional() });

/** Connections a StasisClient closed: the SDK answers a call on one with INTERNAL "Channel has been shut down". */
const closedConnections = new WeakSet<Client['connection']>();

/** `client`, unless its connection was closed by {@link StasisClient.close} (UNAVAILABLE). */
function open(client: Client): Client {
  if (closedConnections.has(client.connection)) throw new StasisError('UNAVAILABLE', 'the client is closed');
  return client;
}

/** How {@link StasisClient.connect} reaches Temporal and what it gives new Runs and sandboxes. */
export interface StasisClientOptions {
  /** A connected Temporal client; otherwise one is made from address/namespace. */
  client?: Client;
  /** How to connect (see common/temporal-connection.ts); the environment's connection when omitted (its namespace still applies). */
  connection?: TemporalConnectionOptions;
  /** The Temporal namespace; the environment's (TEMPORAL_NAMESPACE, temporal.toml) or `default` when omitted. */
  namespace?: string;
  /**
   * Where `namespace` came from, as {@link StasisClient.connect} names it when the server does not have
   * it: `namespace` (this option) by default; clientOptions() says `TEMPORAL_NAMESPACE`.
   */
  namespaceSetting?: string;
  /** The shared task queue the Stasis workers poll (STASIS_TASK_QUEUE); `stasis` when omitted. */
  taskQueue?: string;
  /** STASIS_SUSPENDED_RETENTION_SECONDS given to new standalone sandboxes. */
  suspendedRetentionSeconds?: number;
  /**
   * Where worker-side metrics (failures, retries, release latency) come from; absent, metricsSnapshot
   * reports them as 0. `clientOptions(loadConfig())` reads them from the store the workers write to.
   */
  workerMetrics?: WorkerMetricsSource;
  /** Where active workspaces may live (STASIS_HOST_PATHS, STASIS_DATA_DIR); absent: nowhere. */
  hostPaths?: HostPathPolicy;
}

/**
 * The typed client: Runs, standalone sandboxes and metrics over the Temporal client.
 * Every refusal is a {@link StasisError} with a `code` and the `httpStatus` the REST API answers.
 *
 * ```ts
 * const stasis = await StasisClient.connect();
 * const { runId } = await stasis.runs.start(spec);
 * ```
 */
export class StasisClient {
  /** Start, inspect, answer, suspend, resume and cancel Runs. */
  readonly runs: RunsApi;
  /** Create and drive standalone sandboxes (no Run, no agent loop). */
  readonly sandboxes: SandboxesApi;
  private readonly identities = new Map<string, StasisClient>();
  /** The shared task queue of the workers this client drives (options.taskQueue, checked). */
  private readonly taskQueue: string;
  /** Made by {@link withIdentity}: the connection is its parent's, and close() leaves it open. */
  private borrowsConnection = false;

  /** Wraps a connected Temporal client; {@link StasisClient.connect} makes one from the environment. */
  constructor(
    /** The underlying Temporal client, for anything Stasis does not wrap. */
    readonly temporal: Client,
    private readonly options: StasisClientOptions = {},
  ) {
    const taskQueue = options.taskQueue ?? DEFAULT_TASK_QUEUE;
    // A worker polls only such a queue (STASIS_TASK_QUEUE), and listings put it in a visibility query.
    if (typeof taskQueue !== 'string' || !QUEUE_NAME.test(taskQueue))
      throw new StasisError('INVALID_ARGUMENT', `taskQueue: ${QUEUE_NAME_RULE} (got ${JSON.stringify(taskQueue)})`);
    this.taskQueue = taskQueue;
    const hostPaths = options.hostPaths ?? { allowed: [] };
    this.runs = new RunsApi(temporal, taskQueue, hostPaths);
    this.sandboxes = new SandboxesApi(
      temporal,
      taskQueue,
      options.suspendedRetentionSeconds ?? DEFAULT_SUSPENDED_RETENTION_SECONDS,
      hostPaths,
    );
  }

  /**
   * This client acting as `identity`, on the same connection: Temporal records the
   * identity on the events of what it starts, signals, cancels and updates, so
   * Temporal Web shows who did it. One client per identity, kept. The identity is
   * 1-256 characters without control characters ({@link ClientIdentity}); anything else
   * is INVALID_ARGUMENT naming `identity`, thrown at once. The client made shares this
   * one's connection without owning it: its close() does nothing, and it is closed
   * when this client is.
   */
  withIdentity(identity: string): StasisClient {
    checkString(identity, 'identity');
    const parsed = ClientIdentity.safeParse(identity);
    if (!parsed.success) {
      const problems = parsed.error.issues.map((issue) => issue.message).join('; ');
      throw new StasisError('INVALID_ARGUMENT', `identity ${shown(identity)}: ${problems}`);
    }
    let client = this.identities.get(identity);
    if (!client) {
      const { namespace, dataConverter, interceptors } = this.temporal.options;
      const temporal = new Client({
        connection: this.temporal.connection,
        namespace,
        dataConverter,
        interceptors,
        identity,
      });
      client = new StasisClient(temporal, this.options);
      client.borrowsConnection = true;
      this.identities.set(identity, client);
    }
    return client;
  }

  /**
   * Connects to Temporal: `options.client` if given, else `options.connection`, else the environment
   * (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS_*`, `TEMPORAL_PROFILE`,
   * `temporal.toml`, through `@temporalio/envconfig`); the environment also gives the namespace when
   * `options.namespace` is absent. UNAVAILABLE naming the address when the server cannot be reached;
   * INVALID_ARGUMENT (a ConfigError, which is a StasisError) naming the namespace, and `namespace` or
   * TEMPORAL_NAMESPACE as where it came from, when the server does not have it.
   */
  static async connect(options: StasisClientOptions = {}): Promise<StasisClient> {
    if (options.client) return new StasisClient(options.client, options);
    const fromEnv =
      options.connection === undefined || options.namespace === undefined ? temporalConnectConfig() : undefined;
    const connectionOptions = options.connection ?? fromEnv!.connectionOptions;
    let connection: Connection;
    try {
      connection = await Connection.connect(connectionOptions);
    } catch (err) {
      throw new StasisError(
        'UNAVAILABLE',
        `Temporal is not reachable at ${connectionOptions.address} (${err instanceof Error ? err.message : String(err)})`,
      );
    }
    const namespace = options.namespace ?? fromEnv?.namespace ?? DEFAULT_TEMPORAL_NAMESPACE;
    try {
      // Named as the caller gave it: an option is not an environment variable.
      const setting =
        options.namespace === undefined ? 'TEMPORAL_NAMESPACE' : (options.namespaceSetting ?? 'namespace');
      await checkNamespace(connection.workflowService, namespace, connectionOptions.address, setting);
    } catch (err) {
      await connection.close();
      throw err;
    }
    return new StasisClient(new Client({ connection, namespace }), options);
  }

  /**
   * Diagnostics: active, retained and blocked sandboxes of this client's task queue, and release failures,
   * retries and latency of the hosts its store holds figures of.
   */
  async metricsSnapshot(): Promise<MetricsSnapshot> {
    return collectMetrics(open(this.temporal), this.taskQueue, this.options.workerMetrics);
  }

  /**
   * Closes the Temporal connection (the one `connect` made, or the one of the client given), and with
   * it the clients of {@link withIdentity}, which share it; every call after it is UNAVAILABLE. Closing
   * again does nothing. On a client of withIdentity, close() does nothing: the connection is not
   * its own, and its parent and the other identities go on using it.
   */
  async close(): Promise<void> {
    if (this.borrowsConnection) return;
    const { connection } = this.temporal;
    if (closedConnections.has(connection)) return;
    closedConnections.add(connection);
    await connection.close();
  }
}

/**
 * Runs: durable agent Runs, each a `runWorkflow` whose workflow id is the Run id. Only the Runs of this
 * client's task queue: a Run of another deployment sharing the namespace is NOT_FOUND, as an unknown one
 * (client/owned-workflows.ts).
 */
export class RunsApi {
  /** The Runs of this queue checked so far, for Updates and cancels. */
  private readonly owned: OwnedWorkflows;

  constructor(
    private readonly client: Client,
    private readonly taskQueue: string,
    private readonly hostPaths: HostPathPolicy,
  ) {
    this.owned = new OwnedWorkflows(taskQueue, 'runWorkflow');
  }

  /** The Temporal client, while the connection is open. */
  private get temporal(): Client {
    return open(this.client);
  }

  /** The Run described now, checked to be of this queue (NOT_FOUND otherwise): for reads. */
  private described(runId: string) {
    checkRunId(runId);
    return this.owned.describe<typeof runWorkflow>(this.temporal, runId, `run ${runId}`);
  }

  /** A handle for Updates and cancel, bound to the chain checked to be of this queue (NOT_FOUND otherwise). */
  private handle(runId: string): Promise<WorkflowHandle<typeof runWorkflow>> {
    checkRunId(runId);
    return this.owned.forUpdate<typeof runWorkflow>(this.temporal, runId, `run ${runId}`);
  }

  /**
   * Validates `spec` (a RunSpec) and starts its Run; the Run id is `spec.runId` or a new `run-<uuid>`.
   * INVALID_ARGUMENT names the bad field (`options.inputName` prefixes it, e.g. the REST API's `body`);
   * ALREADY_EXISTS when a Run with that id exists or existed (ids are never reused: a second Run under
   * one id would take over the first one's sandbox id); FORBIDDEN for an active workspace outside the host paths.
   */
  async start(spec: unknown, options: { inputName?: string } = {}): Promise<{ runId: string }> {
    const valid = checkedInput(RunSpec, spec, options.inputName ?? 'spec');
    await checkHostPaths(activeWorkspacesOfRun(valid), this.hostPaths, `${options.inputName ?? 'spec'}.`);
    const runId = valid.runId ?? `run-${randomUUID()}`;
    try {
      const started = await this.temporal.workflow.start<typeof runWorkflow>('runWorkflow', {
        taskQueue: this.taskQueue,
        workflowId: runId,
        workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
        args: [{ spec: valid }],
        typedSearchAttributes: [
          { key: StasisKind, value: 'run' },
          { key: StasisStatus, value: 'RUNNING' },
          { key: StasisProvider, value: valid.sandbox.provider },
          { key: StasisResourceState, value: 'PROVISIONING' },
          { key: StasisPendingInteractions, value: 0 },
          ...(labelKeywords(valid.labels).length ? [{ key: StasisLabels, value: labelKeywords(valid.labels) }] : []),
        ],
        staticSummary: `Stasis Run ${runId}: ${valid.agent.driver} agent on ${valid.sandbox.provider}`,
        staticDetails: valid.labels
          ? Object.entries(valid.labels)
              .map(([k, v]) => `${k}: ${v}`)
              .join('\n')
          : undefined,
      });
      this.owned.remember(runId, started.firstExecutionRunId);
    } catch (err) {
      // The same words whoever holds the id (this deployment or another in the namespace): a workflow id
      // is unique in a namespace, and this says only that it is taken. The other's workflow is untouched.
      if (err instanceof WorkflowExecutionAlreadyStartedError)
        throw new StasisError(
          'ALREADY_EXISTS',
          `run ${runId} already exists (a Run id is used once in the Temporal namespace, also after its Run ended)`,
        );
      throw toStasisError(err, `run ${runId}`);
    }
    return { runId };
  }

  /**
   * The user-visible snapshot: status, interactions, output or error, parent and children. NOT_FOUND if unknown.
   * A Run whose workflow Temporal closed without the Run's end (terminated, timed out) is FAILED with RUN_FAILED.
   */
  async get(runId: string): Promise<RunSnapshot> {
    // Described first (the queue check): a workflow closed then answers its last state, for good.
    const { handle, description } = await this.described(runId);
    try {
      const snapshot = await handle.query(snapshotQuery);
      const closed = description.status.name;
      if (isTerminal(snapshot.status) || !workflowClosed(closed)) return snapshot;
      return endedOutside(snapshot, await closeReason(this.temporal, runId, closed));
    } catch (err) {
      throw toStasisError(err, `run ${runId}`);
    }
  }

  /** The operator view, with a retrying release's (or restore's, fused or not) live attempt count and last error from Temporal. */
  async resource(runId: string): Promise<ResourceView> {
    const { handle, description } = await this.described(runId);
    try {
      const view = await handle.query(resourceQuery);
      const pending = (type: string) => description.raw.pendingActivities?.find((a) => a.activityType?.name === type);
      const state = view.record.state;
      const retrying =
        state === 'RELEASING' || state === 'RELEASE_BLOCKED'
          ? pending('releaseSandbox')
          : state === 'RESTORING'
            ? // A resume fused with the Run's next job restores inside that job's activity.
              (pending('restoreSandbox') ?? pending('resumeAndExecInSandbox'))
            : undefined;
      if (retrying) {
        view.record.attempts = retrying.attempt ?? view.record.attempts;
        const lastFailure = retrying.lastFailure?.message;
        if (lastFailure) view.record.lastError = lastFailure;
      }
      return view;
    } catch (err) {
      throw toStasisError(err, `run ${runId}`);
    }
  }

  /**
   * The Runs of this client's task queue (those its workers serve; another deployment sharing the namespace
   * has its own), newest first; `status` filters through the StasisStatus search attribute. INVALID_ARGUMENT
   * for a bad `status` or `limit`. Each Run listed is read by a query; one that cannot be read (no worker
   * answers it, its workflow task fails) fails the whole list, naming that Run and the cause (UNAVAILABLE
   * when Temporal or a worker did not answer in time, INTERNAL otherwise): a list never leaves a Run out
   * silently. A Run {@link get} answers NOT_FOUND for (deleted since the listing) is left out.
   */
  async list(filter: { status?: RunStatus; limit?: number } = {}): Promise<RunSnapshot[]> {
    checkObject(filter, 'filter');
    // Checked, never spliced into the visibility query as given.
    if (filter.status !== undefined) parseOrInvalid(RunStatus, filter.status, 'status');
    checkLimit(filter.limit);
    const query = [
      `StasisKind = 'run'`,
      `TaskQueue = '${this.taskQueue}'`,
      filter.status ? statusClause(filter.status) : undefined,
    ]
      .filter(Boolean)
      .join(' AND ');
    const ids: string[] = [];
    const closed = new Map<string, string>();
    try {
      for await (const wf of this.temporal.workflow.list({ query })) {
        // The query keeps to the queue; a listing that ignored it (a proxy, a test double) still does not mix deployments.
        if (wf.taskQueue !== this.taskQueue) continue;
        if (!ids.includes(wf.workflowId)) ids.push(wf.workflowId);
        if (workflowClosed(wf.status.name)) closed.set(wf.workflowId, wf.status.name);
        if (ids.length >= (filter.limit ?? 200)) break;
      }
    } catch (err) {
      throw toStasisError(err, 'runs');
    }
    const snapshots = await Promise.all(
      ids.map(async (id) => {
        const snapshot = await this.listedSnapshot(id, 'runs');
        // Closed without the Run's end (terminated, timed out): ended, as get() says.
        const status = closed.get(id);
        return snapshot && status && !isTerminal(snapshot.status)
          ? endedOutside(snapshot, await closeReason(this.temporal, id, status))
          : snapshot;
      }),
    );
    // Visibility lags the workflow a little: trust the snapshot for the status filter.
    return snapshots.filter((s): s is RunSnapshot => s !== undefined && (!filter.status || s.status === filter.status));
  }

  /**
   * The snapshot of a Run a listing named; undefined where {@link get} answers NOT_FOUND (deleted since
   * the listing, or a workflow of another kind). Any other failure (no worker answers the query, the Run's
   * workflow task fails) fails the listing, naming the Run and the cause: a Run left out of a list
   * silently reads as no Run at all.
   * With `closedHasNone`, a Run closed since the listing that cannot be queried is undefined too: a
   * closed Run waits on no one.
   */
  private async listedSnapshot(
    runId: string,
    listing: string,
    closedHasNone = false,
  ): Promise<RunSnapshot | undefined> {
    // The ids come from Temporal itself: asked as they are, not through the checks of an id a caller gives.
    const handle = this.temporal.workflow.getHandle<typeof runWorkflow>(runId);
    try {
      return await handle.query(snapshotQuery);
    } catch (err) {
      const failure = toStasisError(err, `run ${runId}`);
      if (failure.code === 'NOT_FOUND') return undefined;
      if (closedHasNone) {
        const described = await handle.describe().catch(() => undefined);
        if (described && described.status.name !== 'RUNNING') return undefined;
      }
      // The client wraps the server's answer ("Failed to query Workflow"): its status says why.
      const cause = grpcErrorOf(err)?.message ?? (err instanceof Error ? err.message : String(err));
      throw new StasisError(failure.code, `${listing}: run ${runId} could not be read (${cause})`);
    }
  }

  /**
   * Every pending interaction of the Runs of this client's task queue, oldest first, a page at a
   * time, from one visibility listing: each waiting Run keeps its pending interactions in its memo
   * (no query per Run, except a Run started before the memo existed). `after` is the `next` of the
   * previous page. A Run that must be queried and cannot be fails the call as in {@link list},
   * unless it closed since the listing (a closed Run waits on no one) or is gone.
   */
  async pendingInteractions(
    page: { limit?: number; after?: string } = {},
  ): Promise<{ interactions: PendingInteraction[]; next?: string }> {
    checkObject(page, 'page');
    checkLimit(page.limit);
    const after = page.after === undefined ? undefined : decodeCursor(page.after);
    if (after === null) throw new StasisError('INVALID_ARGUMENT', 'after: not a page cursor this API gave');
    const items: PendingInteraction[] = [];
    try {
      const seen = new Set<string>();
      for await (const wf of this.temporal.workflow.list({
        query: `StasisKind = 'run' AND TaskQueue = '${this.taskQueue}' AND StasisPendingInteractions > 0`,
      })) {
        if (seen.has(wf.workflowId) || wf.status.name !== 'RUNNING' || wf.taskQueue !== this.taskQueue) continue;
        seen.add(wf.workflowId);
        const memo = wf.memo?.[PENDING_MEMO] as (InteractionRequest & { diffTruncated?: true })[] | undefined;
        // A memo past its bound lists its interactions without their bulk (workflows/run-state.ts,
        // fitPendingMemo): they are read whole from the Run, as they are left in the memo if it cannot answer.
        const cut = memo?.some((i) => i.contentForgotten) === true;
        const read = (): Promise<InteractionRequest[] | undefined> =>
          this.listedSnapshot(wf.workflowId, 'interactions', true).then((shown) =>
            shown?.interactions.filter((i) => i.status === 'pending'),
          );
        const pending = cut ? ((await read().catch(() => undefined)) ?? memo ?? []) : (memo ?? (await read()) ?? []);
        for (const { diffTruncated, ...interaction } of pending as (InteractionRequest & { diffTruncated?: true })[]) {
          items.push({
            runId: wf.workflowId,
            runStartedAt: wf.startTime.toISOString(),
            interaction,
            ...(diffTruncated ? { diffTruncated } : {}),
          });
        }
      }
    } catch (err) {
      throw toStasisError(err, 'interactions');
    }
    const key = (p: PendingInteraction): Cursor => [p.interaction.createdAt, p.runId, p.interaction.id];
    items.sort((a, b) => compareCursors(key(a), key(b)));
    const from = after ? items.filter((p) => compareCursors(key(p), after) > 0) : items;
    const limit = page.limit ?? 50;
    const interactions = from.slice(0, limit);
    const last = interactions[interactions.length - 1];
    return { interactions, ...(from.length > limit && last ? { next: encodeCursor(key(last)) } : {}) };
  }

  /**
   * Answers a pending interaction through the `respond` Update; resolves with the answered interaction.
   * Refused before anything is recorded: NOT_FOUND (unknown interaction), ALREADY_ANSWERED (a different
   * answer was given; the same answer with the same `updateId` is idempotent), INVALID_ARGUMENT (the
   * answer's shape, an answer the interaction does not accept, or an `updateId` already used for another
   * interaction's answer), STALE_SANDBOX_ROUTE (the Run expired). `respondedBy` (1-256 characters) is
   * recorded with the answer; `anonymous` when absent.
   */
  async respond(
    runId: string,
    interactionId: string,
    response: unknown,
    options: { respondedBy?: string; updateId?: string } = {},
  ): Promise<InteractionRequest> {
    checkRunId(runId);
    checkId(interactionId, 'interactionId');
    const { respondedBy, updateId } = parseOrInvalid(RespondOptions, options, 'options');
    const valid = checkedInput(InteractionResponse, response, 'response');
    let answered: InteractionRequest;
    try {
      const handle = await this.handle(runId);
      answered = await sendUpdate(
        (id) =>
          handle.executeUpdate(respondUpdate, {
            args: [{ interactionId, response: valid, ...(respondedBy !== undefined ? { respondedBy } : {}) }],
            updateId: id,
          }),
        updateId,
      );
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
    // Temporal answers an Update id it has seen with that Update's result before the Run's validator
    // runs: a reused id brings back the answer it was first given, which may be another one.
    if (answered.id !== interactionId)
      throw new StasisError(
        'INVALID_ARGUMENT',
        `options: updateId: already used for another answer (interaction ${answered.id})`,
      );
    // A result past the Run's payload bound comes without its bulk (contentForgotten): compare what it kept.
    const given = answered.contentForgotten ? forgetContent({ ...answered, response: valid }).response : valid;
    if (canonicalJson(answered.response) !== canonicalJson(given))
      throw new StasisError('ALREADY_ANSWERED', `interaction ${interactionId} was already answered`);
    return answered;
  }

  /**
   * Answers through the `respondSignal` signal instead of the `respond` Update: for a
   * client that cannot wait for an Update's result. Refused like respond() before anything
   * is sent (PAYLOAD_TOO_LARGE, INVALID_ARGUMENT, and NOT_FOUND, ALREADY_ANSWERED or an answer
   * the interaction does not accept, from the Run's snapshot). The Run checks again and ignores
   * (and logs) an answer it refuses, so read the Run afterwards to see whether it was taken.
   */
  async respondBySignal(
    runId: string,
    interactionId: string,
    response: unknown,
    options: { respondedBy?: string } = {},
  ): Promise<void> {
    checkRunId(runId);
    checkId(interactionId, 'interactionId');
    const { respondedBy } = parseOrInvalid(RespondOptions.omit({ updateId: true }), options, 'options');
    const valid = checkedInput(InteractionResponse, response, 'response');
    // A refused signal still lands in the Run's history (and bloats it): one query first.
    const refused = checkRespond(
      { ...(await this.get(runId)), answeredBy: {} },
      { interactionId, response: valid },
      undefined,
    );
    if (refused && refused !== 'duplicate') throw new StasisError(refused.code, refused.message);
    try {
      // A signal names only the workflow id: the get above checked it is this queue's Run.
      await (
        await this.handle(runId)
      ).signal(respondSignal, {
        interactionId,
        response: valid,
        ...(respondedBy !== undefined ? { respondedBy } : {}),
      });
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
  }

  /** Releases the Run's sandbox now (a manual suspension); resolves once the release is admitted. */
  async suspend(runId: string): Promise<RunSnapshot> {
    try {
      const handle = await this.handle(runId);
      return await sendUpdate((updateId) => handle.executeUpdate(suspendRunUpdate, { updateId }));
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
  }

  /**
   * Brings back a manually suspended or held Run's sandbox (restoring it on any host if its own is gone).
   * Resolves once the resume is taken: the sandbox is back (`ACTIVE`), or, when the agent takes its next
   * step first, comes back with that step's action (`RESUMING` until then).
   */
  async resume(runId: string): Promise<RunSnapshot> {
    try {
      const handle = await this.handle(runId);
      return await sendUpdate((updateId) => handle.executeUpdate(resumeRunUpdate, { updateId }));
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
  }

  /**
   * Cancels the Run: its compute is released, its children cancelled, and it ends CANCELLED.
   * INVALID_STATE_TRANSITION if it already ended.
   */
  async cancel(runId: string): Promise<RunSnapshot> {
    // Temporal accepts a cancel request for a closed workflow; the contract answers 409.
    const current = await this.get(runId);
    if (isTerminal(current.status))
      throw new StasisError('INVALID_STATE_TRANSITION', `run ${runId} is ${current.status}`);
    try {
      await (await this.handle(runId)).cancel();
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
    return this.get(runId);
  }

  /**
   * Sends an external agent's action `{actionId, action}` to its Run and waits up to
   * `waitMs` (default ACTION_WAIT_MS) for it to finish. The answer is the action's view:
   * `succeeded`/`failed` with its result or error, or still `running` (or `waiting` on a
   * person, for an ask) when the wait ran out; read it later with action(). The same
   * actionId again returns the same outcome and never runs the action twice.
   */
  async act(
    runId: string,
    request: unknown,
    options: { waitMs?: number; inputName?: string } = {},
  ): Promise<ActionView> {
    checkRunId(runId);
    const { waitMs, inputName } = parseOrInvalid(ActOptions, options, 'options');
    const name = inputName ?? 'request';
    const valid = checkedInput(ActionRequest, request, name);
    if (valid.action.type === 'spawn') {
      await checkHostPaths(activeWorkspacesOfRun(valid.action.spec, 'action.spec.'), this.hostPaths, `${name}.`);
    }
    let view: ActionView;
    try {
      const handle = await this.handle(runId);
      view = await sendUpdate((updateId) => handle.executeUpdate(actUpdate, { args: [valid], updateId }));
    } catch (err) {
      // A retried action of a Run that has since ended: its outcome, if the Run kept it.
      const known = isClosedWorkflow(err) ? await this.action(runId, valid.actionId).catch(() => undefined) : undefined;
      if (known && known.bodyHash === actionBodyHash(valid.action)) return known;
      if (known) {
        throw new StasisError(
          'IDEMPOTENCY_CONFLICT',
          `action ${valid.actionId}: this actionId was already used with another body`,
        );
      }
      throw await this.closedRunError(runId, err);
    }
    return this.awaitAction(runId, view, waitMs ?? ACTION_WAIT_MS);
  }

  /** An external agent's action by its actionId: its status, and its result or error once settled. */
  async action(runId: string, actionId: string): Promise<ActionView> {
    checkRunId(runId);
    checkId(actionId, 'actionId');
    // Described first (the queue check): a workflow closed then answers its last state, for good.
    const { handle, description } = await this.described(runId);
    let view: ActionView | null;
    try {
      view = await handle.query(actionQuery, actionId);
      // Under way in a workflow closed without the Run's end: it never settles (a Run that ended on
      // its own settles its actions, failed with its reason).
      const closed = description.status.name;
      if (view && !isSettled(view) && workflowClosed(closed))
        view = actionEndedOutside(view, await closeReason(this.temporal, runId, closed));
    } catch (err) {
      throw toStasisError(err, `run ${runId}`);
    }
    if (!view) throw new StasisError('NOT_FOUND', `action ${actionId} not found on run ${runId}`);
    return view;
  }

  /** Reads the action's view until it settles, waits on a person, or `waitMs` runs out (never longer). */
  private async awaitAction(runId: string, view: ActionView, waitMs: number): Promise<ActionView> {
    const deadline = Date.now() + waitMs;
    for (let delayMs = 50; view.status === 'running'; delayMs = Math.min(delayMs * 2, 1_000)) {
      const left = deadline - Date.now();
      if (left <= 0) break;
      await sleep(Math.min(delayMs, left));
      view = await this.action(runId, view.actionId);
    }
    return view;
  }

  /** An update to a closed Run: say why in the contract's terms. */
  private async closedRunError(runId: string, err: unknown): Promise<StasisError> {
    if (!isClosedWorkflow(err)) {
      const failure = toStasisError(err, `run ${runId}`);
      // Temporal no longer has the chain checked (deleted): the next call checks the id again.
      if (failure.code === 'NOT_FOUND') this.owned.forget(runId);
      return failure;
    }
    return refusedByClosedRun(runId, err, await this.get(runId).catch(() => undefined));
  }
}

/**
 * Standalone sandboxes: each a `sandboxWorkflow` (id `sandbox-<sandboxId>`) with the same lifecycle rules as a
 * Run's. Only the sandboxes of this client's task queue: one of another deployment sharing the namespace is
 * NOT_FOUND, as an unknown one (client/owned-workflows.ts). A sandbox whose workflow has ended (destroyed, its
 * provisioning failed, terminated in Temporal) is gone: NOT_FOUND to every call, and listed only as `destroyed`.
 */
export class SandboxesApi {
  /** The sandboxes of this queue checked so far, for Updates. */
  private readonly owned: OwnedWorkflows;

  constructor(
    private readonly client: Client,
    private readonly taskQueue: string,
    private readonly suspendedRetentionSeconds: number,
    private readonly hostPaths: HostPathPolicy,
  ) {
    this.owned = new OwnedWorkflows(taskQueue, 'sandboxWorkflow');
  }

  /** The Temporal client, while the connection is open. */
  private get temporal(): Client {
    return open(this.client);
  }

  /** A handle for Updates, bound to the chain checked to be of this queue (NOT_FOUND otherwise). */
  private handle(sandboxId: string): Promise<WorkflowHandle<typeof sandboxWorkflow>> {
    checkId(sandboxId, 'sandboxId');
    return this.owned.forUpdate<typeof sandboxWorkflow>(
      this.temporal,
      sandboxWorkflowId(sandboxId),
      `sandbox ${sandboxId}`,
    );
  }

  /**
   * Creates a sandbox and resolves once it is provisioned (state `created`). INVALID_ARGUMENT names the bad
   * field (`options.inputName` prefixes it); FORBIDDEN for an active workspace outside the host paths.
   */
  async create(input: unknown, options: { inputName?: string } = {}): Promise<SandboxView> {
    const create = checkedInput(CreateSandboxInput, input, options.inputName ?? 'sandbox');
    await checkHostPaths(activeWorkspacesOfSandbox(create), this.hostPaths, `${options.inputName ?? 'sandbox'}.`);
    const sandboxId = `sbx-${randomUUID().slice(0, 12)}`;
    try {
      const started = await this.temporal.workflow.start<typeof sandboxWorkflow>('sandboxWorkflow', {
        taskQueue: this.taskQueue,
        workflowId: sandboxWorkflowId(sandboxId),
        args: [{ sandboxId, create, suspendedRetentionSeconds: this.suspendedRetentionSeconds }],
        typedSearchAttributes: [
          { key: StasisKind, value: 'sandbox' },
          { key: StasisStatus, value: 'created' },
          { key: StasisProvider, value: create.provider },
          { key: StasisResourceState, value: 'PROVISIONING' },
          ...(create.labels ? [{ key: StasisLabels, value: labelKeywords(create.labels) }] : []),
        ],
        staticSummary: `Stasis sandbox ${sandboxId} (${create.provider})`,
      });
      this.owned.remember(started.workflowId, started.firstExecutionRunId);
      return await sendUpdate((updateId) => started.executeUpdate(sandboxReadyUpdate, { updateId }));
    } catch (err) {
      throw toStasisError(err, `sandbox ${sandboxId}`);
    }
  }

  /**
   * This client's task queue's sandboxes as visibility sees them, newest first, one page at a time:
   * pass the answer's `nextPageToken` for the next page (absent on the last one).
   */
  async list(filter: SandboxListFilter = {}, options: { inputName?: string } = {}): Promise<SandboxPage> {
    const parsed = parseOrInvalid(SandboxListFilterSchema, filter, options.inputName ?? 'filter');
    return listSandboxes(this.temporal, this.taskQueue, parsed);
  }

  /** The sandbox's state and details. NOT_FOUND if unknown, destroyed or its workflow ended (as destroy says). */
  async get(sandboxId: string): Promise<SandboxView> {
    checkId(sandboxId, 'sandboxId');
    // Described first: the queue check, and a closed workflow (which would still answer its last state).
    const { handle, description } = await this.owned.describe<typeof sandboxWorkflow>(
      this.temporal,
      sandboxWorkflowId(sandboxId),
      `sandbox ${sandboxId}`,
    );
    if (workflowClosed(description.status.name)) throw gone(sandboxId);
    let view: SandboxView;
    try {
      view = await handle.query(sandboxQuery);
    } catch (err) {
      throw toStasisError(err, `sandbox ${sandboxId}`);
    }
    if (view.state === 'destroyed') throw gone(sandboxId);
    return view;
  }

  // State changes resolve with the sandbox after the change; an illegal one is INVALID_STATE_TRANSITION (409).
  /** created/stopped → running. */
  start = (id: string) => this.change(id, startSandboxUpdate);
  /** running → stopped: its processes end, its workspace stays. */
  stop = (id: string) => this.change(id, stopSandboxUpdate);
  /** running → paused: processes frozen, memory and files kept. */
  pause = (id: string) => this.change(id, pauseSandboxUpdate);
  /** paused or suspended → running (restored on any host if its own is gone); idempotent when running. */
  resume = (id: string) => this.change(id, resumeSandboxUpdate);
  /** running → suspended: compute released, workspace kept. SANDBOX_SUSPEND_BUSY while a command runs; idempotent. */
  suspend = (id: string) => this.change(id, suspendSandboxUpdate);
  /** Destroys the sandbox and deletes its workspace and every checkpoint. */
  destroy = (id: string) => this.change(id, destroySandboxUpdate);

  /** Runs `{command, timeoutMs?, env?}` in the running sandbox; resolves with exit code and output (each stream's last 128 KiB). */
  async exec(sandboxId: string, input: unknown): Promise<ExecResult> {
    checkId(sandboxId, 'sandboxId');
    const valid = checkedInput(ExecInput, input, 'exec');
    return this.update(sandboxId, (handle, updateId) =>
      handle.executeUpdate(execSandboxUpdate, { args: [valid], updateId }),
    );
  }

  /** A workspace file's bytes (up to FILE_LIMIT_BYTES); the path is relative to the workspace and never follows a symlink out. */
  async readFile(sandboxId: string, path: string): Promise<Buffer> {
    checkId(sandboxId, 'sandboxId');
    if (!path) throw new StasisError('INVALID_ARGUMENT', 'path: required');
    const out = await this.update(sandboxId, (handle, updateId) =>
      handle.executeUpdate(readFileUpdate, { args: [{ path }], updateId }),
    );
    return Buffer.from(out.contentBase64, 'base64');
  }

  /**
   * Writes `content` (a Buffer or Uint8Array) to a workspace file atomically; PAYLOAD_TOO_LARGE over
   * FILE_LIMIT_BYTES. INVALID_ARGUMENT for any other content: a string has no bytes until encoded.
   */
  async writeFile(sandboxId: string, path: string, content: Buffer | Uint8Array): Promise<void> {
    checkId(sandboxId, 'sandboxId');
    if (!path) throw new StasisError('INVALID_ARGUMENT', 'path: required');
    if (!(content instanceof Uint8Array))
      throw new StasisError('INVALID_ARGUMENT', 'content: must be a Buffer or Uint8Array');
    // A Uint8Array's own toString ignores 'base64': its bytes go through a Buffer over them.
    const bytes = Buffer.from(content.buffer, content.byteOffset, content.byteLength);
    if (bytes.length > FILE_LIMIT_BYTES) {
      throw new StasisError('PAYLOAD_TOO_LARGE', `file content must be at most ${FILE_LIMIT_BYTES} bytes`);
    }
    await this.update(sandboxId, (handle, updateId) =>
      handle.executeUpdate(writeFileUpdate, {
        args: [{ path, contentBase64: bytes.toString('base64') }],
        updateId,
      }),
    );
  }

  private change(sandboxId: string, def: typeof startSandboxUpdate): Promise<SandboxView> {
    return this.update(sandboxId, (handle, updateId) => handle.executeUpdate(def, { updateId }));
  }

  /** `call` sent as an Update (sendUpdate's retries) to the sandbox, once checked to be of this queue. */
  private async update<T>(
    sandboxId: string,
    call: (handle: WorkflowHandle<typeof sandboxWorkflow>, updateId: string) => Promise<T>,
  ): Promise<T> {
    const handle = await this.handle(sandboxId);
    try {
      return await sendUpdate((updateId) => call(handle, updateId));
    } catch (err) {
      if (isClosedWorkflow(err)) throw gone(sandboxId);
      const failure = toStasisError(err, `sandbox ${sandboxId}`);
      // Temporal no longer has the chain checked (deleted): the next call checks the id again.
      if (failure.code === 'NOT_FOUND') this.owned.forget(sandboxWorkflowId(sandboxId));
      throw failure;
    }
  }
}

/** A sandbox whose workflow has ended, or that is destroyed: no call reaches it any more. */
function gone(sandboxId: string): StasisError {
  return new StasisError('NOT_FOUND', `sandbox ${sandboxId} not found (destroyed)`);
}
