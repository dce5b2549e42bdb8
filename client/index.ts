import { randomUUID } from 'node:crypto';
import { Client, Connection, type WorkflowHandle } from '@temporalio/client';
import { describeIssues, StasisError } from '../common/errors';
import { activeWorkspacesOfRun, activeWorkspacesOfSandbox, checkHostPaths, type HostPathPolicy } from '../common/host-paths';
import {
  DEFAULT_TEMPORAL_NAMESPACE,
  temporalConnectConfig,
  type TemporalConnectionOptions,
} from '../common/temporal-connection';
import {
  CreateSandboxInput,
  ExecInput,
  InteractionResponse,
  RunSpec,
  type ExecResult,
  type InteractionRequest,
  type MetricsSnapshot,
  type ResourceView,
  type RunSnapshot,
  type RunStatus,
  type SandboxView,
} from '../common/schemas';
import type { z } from 'zod';
import {
  destroySandboxUpdate,
  execSandboxUpdate,
  FILE_LIMIT_BYTES,
  pauseSandboxUpdate,
  readFileUpdate,
  resourceQuery,
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
import { isTerminal } from '../workflows/run-state';
import { StasisKind, StasisProvider, StasisStatus, StasisResourceState } from '../workflows/search-attributes';
import { isClosedWorkflow, refusedByClosedRun, toStasisError } from './errors';
import { sendUpdate } from './updates';
import { collectMetrics, type WorkerMetricsSource } from './metrics';

export { StasisError } from '../common/errors';

export interface StasisClientOptions {
  /** A connected Temporal client; otherwise one is made from address/namespace. */
  client?: Client;
  /** How to connect (see common/temporal-connection.ts); the environment's connection when omitted. */
  connection?: TemporalConnectionOptions;
  namespace?: string;
  taskQueue?: string;
  /** STASIS_SUSPENDED_RETENTION_SECONDS given to new standalone sandboxes. */
  suspendedRetentionSeconds?: number;
  /** Where worker-side metrics (failures, retries, release latency) come from. */
  workerMetrics?: WorkerMetricsSource;
  /** Where active workspaces may live (STASIS_HOST_PATHS, STASIS_DATA_DIR); absent: nowhere. */
  hostPaths?: HostPathPolicy;
}

function parse<S extends z.ZodType>(schema: S, value: unknown, what: string): z.infer<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new StasisError('INVALID_ARGUMENT', `${what}: ${describeIssues(parsed.error.issues)}`);
  return parsed.data;
}

/** The typed client: runs, sandboxes and metrics over the Temporal client. */
export class StasisClient {
  readonly runs: RunsApi;
  readonly sandboxes: SandboxesApi;
  private readonly identities = new Map<string, StasisClient>();

  constructor(
    readonly temporal: Client,
    private readonly options: StasisClientOptions = {},
  ) {
    const taskQueue = options.taskQueue ?? 'stasis';
    const hostPaths = options.hostPaths ?? { allowed: [] };
    this.runs = new RunsApi(temporal, taskQueue, hostPaths);
    this.sandboxes = new SandboxesApi(temporal, taskQueue, options.suspendedRetentionSeconds ?? 2_592_000, hostPaths);
  }

  /**
   * This client acting as `identity`, on the same connection: Temporal records the
   * identity on the events of what it starts, signals, cancels and updates, so
   * Temporal Web shows who did it. One client per identity, kept.
   */
  withIdentity(identity: string): StasisClient {
    let client = this.identities.get(identity);
    if (!client) {
      const { namespace, dataConverter, interceptors } = this.temporal.options;
      const temporal = new Client({ connection: this.temporal.connection, namespace, dataConverter, interceptors, identity });
      client = new StasisClient(temporal, this.options);
      this.identities.set(identity, client);
    }
    return client;
  }

  static async connect(options: StasisClientOptions = {}): Promise<StasisClient> {
    if (options.client) return new StasisClient(options.client, options);
    const fromEnv = options.connection === undefined ? temporalConnectConfig() : undefined;
    const connection = await Connection.connect(options.connection ?? fromEnv?.connectionOptions);
    const namespace = options.namespace ?? fromEnv?.namespace ?? DEFAULT_TEMPORAL_NAMESPACE;
    return new StasisClient(new Client({ connection, namespace }), options);
  }

  async metricsSnapshot(): Promise<MetricsSnapshot> {
    return collectMetrics(this.temporal, this.options.workerMetrics);
  }

  async close(): Promise<void> {
    await this.temporal.connection.close();
  }
}

export class RunsApi {
  constructor(
    private readonly temporal: Client,
    private readonly taskQueue: string,
    private readonly hostPaths: HostPathPolicy,
  ) {}

  private handle(runId: string): WorkflowHandle<typeof runWorkflow> {
    return this.temporal.workflow.getHandle<typeof runWorkflow>(runId);
  }

  /** `options.inputName` names the spec in errors (the REST API's `body`). */
  async start(spec: unknown, options: { inputName?: string } = {}): Promise<{ runId: string }> {
    const valid = parse(RunSpec, spec, options.inputName ?? 'spec');
    await checkHostPaths(activeWorkspacesOfRun(valid), this.hostPaths, `${options.inputName ?? 'spec'}.`);
    const runId = valid.runId ?? `run-${randomUUID()}`;
    try {
      await this.temporal.workflow.start<typeof runWorkflow>('runWorkflow', {
        taskQueue: this.taskQueue,
        workflowId: runId,
        args: [{ spec: valid }],
        typedSearchAttributes: [
          { key: StasisKind, value: 'run' },
          { key: StasisStatus, value: 'RUNNING' },
          { key: StasisProvider, value: valid.sandbox.provider },
          { key: StasisResourceState, value: 'PROVISIONING' },
        ],
        staticSummary: `Stasis Run ${runId}: ${valid.agent.driver} agent on ${valid.sandbox.provider}`,
        staticDetails: valid.labels
          ? Object.entries(valid.labels)
              .map(([k, v]) => `${k}: ${v}`)
              .join('\n')
          : undefined,
      });
    } catch (err) {
      throw toStasisError(err, `run ${runId}`);
    }
    return { runId };
  }

  async get(runId: string): Promise<RunSnapshot> {
    try {
      return await this.handle(runId).query(snapshotQuery);
    } catch (err) {
      throw toStasisError(err, `run ${runId}`);
    }
  }

  /** The operator view, with a retrying release's (or restore's) live attempt count and last error from Temporal. */
  async resource(runId: string): Promise<ResourceView> {
    const handle = this.handle(runId);
    try {
      const [view, description] = await Promise.all([handle.query(resourceQuery), handle.describe()]);
      const pending = (type: string) => description.raw.pendingActivities?.find((a) => a.activityType?.name === type);
      const state = view.record.state;
      const retrying =
        state === 'RELEASING' || state === 'RELEASE_BLOCKED'
          ? pending('releaseSandbox')
          : state === 'RESTORING'
            ? pending('restoreSandbox')
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

  /** Runs, newest first; `status` filters through the StasisStatus search attribute. */
  async list(filter: { status?: RunStatus; limit?: number } = {}): Promise<RunSnapshot[]> {
    const query = [`StasisKind = 'run'`, filter.status ? `StasisStatus = '${filter.status}'` : undefined]
      .filter(Boolean)
      .join(' AND ');
    const ids: string[] = [];
    try {
      for await (const wf of this.temporal.workflow.list({ query })) {
        if (!ids.includes(wf.workflowId)) ids.push(wf.workflowId);
        if (ids.length >= (filter.limit ?? 200)) break;
      }
    } catch (err) {
      throw toStasisError(err, 'runs');
    }
    const snapshots = await Promise.all(ids.map((id) => this.get(id).catch(() => undefined)));
    // Visibility lags the workflow a little: trust the snapshot for the status filter.
    return snapshots.filter((s): s is RunSnapshot => s !== undefined && (!filter.status || s.status === filter.status));
  }

  async respond(
    runId: string,
    interactionId: string,
    response: unknown,
    options: { respondedBy?: string; updateId?: string } = {},
  ): Promise<InteractionRequest> {
    const valid = parse(InteractionResponse, response, 'response');
    try {
      return await sendUpdate(
        (updateId) =>
          this.handle(runId).executeUpdate(respondUpdate, {
            args: [
              { interactionId, response: valid, ...(options.respondedBy ? { respondedBy: options.respondedBy } : {}) },
            ],
            updateId,
          }),
        options.updateId,
      );
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
  }

  async suspend(runId: string): Promise<RunSnapshot> {
    try {
      return await sendUpdate((updateId) => this.handle(runId).executeUpdate(suspendRunUpdate, { updateId }));
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
  }

  async resume(runId: string): Promise<RunSnapshot> {
    try {
      return await sendUpdate((updateId) => this.handle(runId).executeUpdate(resumeRunUpdate, { updateId }));
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
  }

  async cancel(runId: string): Promise<RunSnapshot> {
    // Temporal accepts a cancel request for a closed workflow; the contract answers 409.
    const current = await this.get(runId);
    if (isTerminal(current.status))
      throw new StasisError('INVALID_STATE_TRANSITION', `run ${runId} is ${current.status}`);
    try {
      await this.handle(runId).cancel();
    } catch (err) {
      throw await this.closedRunError(runId, err);
    }
    return this.get(runId);
  }

  /** An update to a closed Run: say why in the contract's terms. */
  private async closedRunError(runId: string, err: unknown): Promise<StasisError> {
    if (!isClosedWorkflow(err)) return toStasisError(err, `run ${runId}`);
    return refusedByClosedRun(runId, err, await this.get(runId).catch(() => undefined));
  }
}

export class SandboxesApi {
  constructor(
    private readonly temporal: Client,
    private readonly taskQueue: string,
    private readonly suspendedRetentionSeconds: number,
    private readonly hostPaths: HostPathPolicy,
  ) {}

  private handle(sandboxId: string): WorkflowHandle<typeof sandboxWorkflow> {
    return this.temporal.workflow.getHandle<typeof sandboxWorkflow>(sandboxWorkflowId(sandboxId));
  }

  /** `options.inputName` names the input in errors (the REST API's `body`). */
  async create(input: unknown, options: { inputName?: string } = {}): Promise<SandboxView> {
    const create = parse(CreateSandboxInput, input, options.inputName ?? 'sandbox');
    await checkHostPaths(activeWorkspacesOfSandbox(create), this.hostPaths, `${options.inputName ?? 'sandbox'}.`);
    const sandboxId = `sbx-${randomUUID().slice(0, 12)}`;
    try {
      await this.temporal.workflow.start<typeof sandboxWorkflow>('sandboxWorkflow', {
        taskQueue: this.taskQueue,
        workflowId: sandboxWorkflowId(sandboxId),
        args: [{ sandboxId, create, suspendedRetentionSeconds: this.suspendedRetentionSeconds }],
        typedSearchAttributes: [
          { key: StasisKind, value: 'sandbox' },
          { key: StasisStatus, value: 'created' },
          { key: StasisProvider, value: create.provider },
        ],
        staticSummary: `Stasis sandbox ${sandboxId} (${create.provider})`,
      });
      return await sendUpdate((updateId) => this.handle(sandboxId).executeUpdate(sandboxReadyUpdate, { updateId }));
    } catch (err) {
      throw toStasisError(err, `sandbox ${sandboxId}`);
    }
  }

  async get(sandboxId: string): Promise<SandboxView> {
    let view: SandboxView;
    try {
      view = await this.handle(sandboxId).query(sandboxQuery);
    } catch (err) {
      throw toStasisError(err, `sandbox ${sandboxId}`);
    }
    if (view.state === 'destroyed') throw new StasisError('NOT_FOUND', `sandbox ${sandboxId} not found (destroyed)`);
    return view;
  }

  start = (id: string) => this.change(id, startSandboxUpdate);
  stop = (id: string) => this.change(id, stopSandboxUpdate);
  pause = (id: string) => this.change(id, pauseSandboxUpdate);
  resume = (id: string) => this.change(id, resumeSandboxUpdate);
  suspend = (id: string) => this.change(id, suspendSandboxUpdate);
  destroy = (id: string) => this.change(id, destroySandboxUpdate);

  async exec(sandboxId: string, input: unknown): Promise<ExecResult> {
    const valid = parse(ExecInput, input, 'exec');
    return this.update(sandboxId, (updateId) =>
      this.handle(sandboxId).executeUpdate(execSandboxUpdate, { args: [valid], updateId }),
    );
  }

  async readFile(sandboxId: string, path: string): Promise<Buffer> {
    if (!path) throw new StasisError('INVALID_ARGUMENT', 'path: required');
    const out = await this.update(sandboxId, (updateId) =>
      this.handle(sandboxId).executeUpdate(readFileUpdate, { args: [{ path }], updateId }),
    );
    return Buffer.from(out.contentBase64, 'base64');
  }

  async writeFile(sandboxId: string, path: string, content: Buffer): Promise<void> {
    if (!path) throw new StasisError('INVALID_ARGUMENT', 'path: required');
    if (content.length > FILE_LIMIT_BYTES) {
      throw new StasisError('PAYLOAD_TOO_LARGE', `file content must be at most ${FILE_LIMIT_BYTES} bytes`);
    }
    await this.update(sandboxId, (updateId) =>
      this.handle(sandboxId).executeUpdate(writeFileUpdate, {
        args: [{ path, contentBase64: content.toString('base64') }],
        updateId,
      }),
    );
  }

  private change(sandboxId: string, def: typeof startSandboxUpdate): Promise<SandboxView> {
    return this.update(sandboxId, (updateId) => this.handle(sandboxId).executeUpdate(def, { updateId }));
  }

  private async update<T>(sandboxId: string, call: (updateId: string) => Promise<T>): Promise<T> {
    try {
      return await sendUpdate(call);
    } catch (err) {
      if (isClosedWorkflow(err)) throw new StasisError('NOT_FOUND', `sandbox ${sandboxId} not found (destroyed)`);
      throw toStasisError(err, `sandbox ${sandboxId}`);
    }
  }
}
