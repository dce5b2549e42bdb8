import {
  ApplicationFailure,
  CancellationScope,
  ContinueAsNew,
  ParentClosePolicy,
  allHandlersFinished,
  condition,
  continueAsNew,
  currentUpdateInfo,
  getExternalWorkflowHandle,
  isCancellation,
  log,
  proxyActivities,
  setHandler,
  sleep,
  startChild,
  workflowInfo,
} from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { AgentAction } from '../drivers/api';
import { durationMs } from '../common/duration';
import { computeRunHashes } from '../common/hashes';
import { RespondInput, type InteractionRequest, type RunSpec, type SuspensionReason } from '../common/schemas';
import { describeIssues } from '../common/errors';
import { ExecutionBindingLifecycleCoordinator, failureCode, failureMessage } from './coordinator';
import {
  childStateSignal,
  resourceQuery,
  respondSignal,
  respondUpdate,
  resumeRunUpdate,
  snapshotQuery,
  suspendRunUpdate,
  type RunWorkflowInput,
} from './definitions';
import {
  blockingChildren,
  checkArity,
  checkRespond,
  choosePauseMode,
  hashMismatches,
  isReleaseBlocked,
  jobsToCancel,
  type Rejection,
} from './lifecycle';
import { isTerminal, pendingInteractions, toResourceView, toSnapshot, type SessionAggregate } from './run-state';
import { nowIso, nowMs } from './clock';
import { Publisher } from './visibility';

const shared = proxyActivities<Activities>({
  startToCloseTimeout: '10m',
  heartbeatTimeout: '1m',
  retry: { initialInterval: '1s', maximumInterval: '1m', maximumAttempts: 10, nonRetryableErrorTypes: ['NOT_FOUND', 'INVALID_ARGUMENT'] },
});

const DEFAULT_RETENTION_SECONDS = 2_592_000;

/** A Run: one agent execution whose sandbox is released while it waits. */
export async function runWorkflow(input: RunWorkflowInput): Promise<unknown> {
  const run = new RunController(input);
  return run.execute();
}

class RunController {
  readonly run: SessionAggregate;
  readonly sandbox: ExecutionBindingLifecycleCoordinator;
  private manualSuspendRequested = false;
  private resumeRequested = false;
  private ttlExpired = false;
  private idlePaused = false;
  private readonly jobScopes = new Map<string, CancellationScope>();
  private lastReportedState?: string;
  private reporting: Promise<void> = Promise.resolve();
  private readonly publisher = new Publisher();
  /** Set by the `complete` action; the Run is COMPLETED once finish() has settled everything. */
  private completed?: { output: unknown };

  constructor(input: RunWorkflowInput) {
    const info = workflowInfo();
    this.run = input.carried ?? newAggregate(info.workflowId, input);
    this.sandbox = new ExecutionBindingLifecycleCoordinator(
      this.run.record,
      {
        ownerId: this.run.runId,
        provider: this.run.spec.sandbox.provider,
        ...(this.run.spec.sandbox.template ? { template: this.run.spec.sandbox.template } : {}),
        ...(this.run.spec.sandbox.env ? { env: this.run.spec.sandbox.env } : {}),
        workspace: this.run.spec.sandbox.workspace ?? { kind: 'isolated' },
        ...(this.run.spec.sandbox.limits ? { limits: this.run.spec.sandbox.limits } : {}),
      },
      () => this.changed(),
    );
    if (this.run.capabilities) this.sandbox.capabilities = this.run.capabilities;
    this.setHandlers();
  }

  private setHandlers(): void {
    setHandler(snapshotQuery, () => toSnapshot(this.run));
    setHandler(resourceQuery, () => toResourceView(this.run, nowMs()));
    setHandler(
      respondUpdate,
      (input) => {
        const check = this.checkAnswer(input, currentUpdateInfo()?.id);
        const interaction = this.run.interactions.find((i) => i.id === input.interactionId) as InteractionRequest;
        if (check !== 'duplicate') this.answer(input, currentUpdateInfo()?.id);
        return interaction;
      },
      {
        validator: (...args: unknown[]) => {
          const arity = checkArity('respond', args, 1);
          if (arity) throw ApplicationFailure.create({ type: arity.code, message: arity.message, nonRetryable: true });
          const check = this.checkAnswer(args[0], currentUpdateInfo()?.id);
          if (check && check !== 'duplicate') throw ApplicationFailure.create({ type: check.code, message: check.message, nonRetryable: true });
        },
      },
    );
    setHandler(respondSignal, (input) => {
      const check = this.checkAnswer(input, undefined);
      if (check === undefined) this.answer(input, undefined);
      else log.warn('respondSignal rejected', { runId: this.run.runId, ...(check === 'duplicate' ? { code: 'DUPLICATE' } : check) });
    });
    setHandler(
      suspendRunUpdate,
      async () => {
        this.manualSuspendRequested = true;
        await condition(() => this.run.phase === 'SUSPENDED' || isTerminal(this.run.status));
        return toSnapshot(this.run);
      },
      {
        validator: (...args: unknown[]) => {
          noArguments('suspend', args);
          if (this.run.status !== 'RUNNING' || this.run.phase !== 'ACTIVE' || this.manualSuspendRequested) {
            throw ApplicationFailure.create({
              type: 'INVALID_STATE_TRANSITION',
              message: `run: cannot suspend while ${this.run.status}/${this.run.phase}`,
              nonRetryable: true,
            });
          }
        },
      },
    );
    setHandler(
      resumeRunUpdate,
      async () => {
        this.resumeRequested = true;
        await condition(() => this.run.phase === 'ACTIVE' || isTerminal(this.run.status));
        return toSnapshot(this.run);
      },
      {
        validator: (...args: unknown[]) => {
          noArguments('resume', args);
          const reason = this.run.suspension?.reason;
          if (this.run.status === 'EXPIRED') {
            throw ApplicationFailure.create({ type: 'STALE_SANDBOX_ROUTE', message: 'run: suspended past retention', nonRetryable: true });
          }
          if (this.run.phase !== 'SUSPENDED' || (reason !== 'MANUAL' && reason !== 'POLICY_HOLD')) {
            throw ApplicationFailure.create({
              type: 'INVALID_STATE_TRANSITION',
              message: `run: nothing to resume (${this.run.phase}${reason ? `, ${reason}` : ''}); answer its interaction instead`,
              nonRetryable: true,
            });
          }
        },
      },
    );
    setHandler(childStateSignal, ({ runId, state, status }) => {
      const child = this.run.children.find((c) => c.runId === runId);
      if (child) child.state = state;
      else this.run.children.push({ runId, state });
      if (status) this.run.childStatus[runId] = status;
      this.changed();
    });
  }

  private checkAnswer(input: unknown, updateId: string | undefined): Rejection | 'duplicate' | undefined {
    const parsed = RespondInput.safeParse(input);
    if (!parsed.success) return { code: 'INVALID_ARGUMENT', message: describeIssues(parsed.error.issues) };
    return checkRespond(this.run, parsed.data, updateId);
  }

  private answer(input: RespondInput, updateId: string | undefined): void {
    const interaction = this.run.interactions.find((i) => i.id === input.interactionId);
    if (!interaction) return;
    Object.assign(interaction, {
      status: 'answered',
      response: input.response,
      respondedBy: input.respondedBy ?? 'anonymous',
      respondedAt: nowIso(),
    });
    this.run.answeredBy[interaction.id] = updateId ? { updateId } : {};
    if (pendingInteractions(this.run).length === 0 && this.run.status === 'WAITING') this.run.status = 'RUNNING';
    this.changed();
  }

  /** Keeps Temporal Web and the parent Run current after every change. */
  private changed(): void {
    this.publisher.run(this.run);
    const report = `${this.run.record.state}/${this.run.status}`;
    if (this.run.parentRunId && report !== this.lastReportedState) {
      this.lastReportedState = report;
      const parent = getExternalWorkflowHandle(this.run.parentRunId);
      const message = { runId: this.run.runId, state: this.run.record.state, status: this.run.status };
      // Chained so reports arrive in order; awaited before the Run closes so the last one is delivered.
      this.reporting = this.reporting
        .then(() => parent.signal(childStateSignal, message))
        .catch((err: unknown) => log.warn('could not report to parent', { error: failureMessage(err) }));
    }
  }

  async execute(): Promise<unknown> {
    this.changed();
    const main = new CancellationScope();
    const ttlScope = this.startTtlTimer(main);
    try {
      await main.run(() => this.loop());
    } catch (err) {
      if (err instanceof ContinueAsNew) throw err;
      if (this.ttlExpired) {
        await CancellationScope.nonCancellable(() => this.endTtl());
      } else if (isCancellation(err)) {
        await CancellationScope.nonCancellable(() => this.endCancelled());
        throw err;
      } else {
        await CancellationScope.nonCancellable(() => this.endFailed(failureCode(err) ?? 'RUN_FAILED', failureMessage(err)));
      }
    } finally {
      ttlScope?.cancel();
      await CancellationScope.nonCancellable(() => this.reporting);
    }
    return this.finalResult();
  }

  private finalResult(): unknown {
    if (this.run.status === 'COMPLETED') return this.run.output;
    throw ApplicationFailure.create({
      type: this.run.error?.code ?? this.run.status,
      message: this.run.error?.message ?? `run ${this.run.status}`,
      nonRetryable: true,
    });
  }

  /** policy.ttl ends the Run whatever its state: the timer cancels the main scope. */
  private startTtlTimer(main: CancellationScope): CancellationScope | undefined {
    const ttl = this.run.spec.policy?.ttl;
    if (!ttl) return undefined;
    this.run.ttlDeadlineMs ??= nowMs() + durationMs(ttl);
    const scope = new CancellationScope();
    const remaining = Math.max(1, this.run.ttlDeadlineMs - nowMs());
    scope
      .run(() => sleep(remaining))
      .then(() => {
        this.ttlExpired = true;
        main.cancel();
      })
      .catch(() => undefined);
    return scope;
  }

  private async loop(): Promise<void> {
    if (this.run.record.state === 'PROVISIONING' && this.run.record.fence === 0) {
      await this.sandbox.provision(true);
      this.run.capabilities = this.sandbox.capabilities;
    }
    while (!isTerminal(this.run.status) && !this.completed) {
      if (this.manualSuspendRequested) {
        await this.suspendAndWait('MANUAL', []);
        continue;
      }
      if (workflowInfo().continueAsNewSuggested && !this.run.jobs.some((j) => j.status === 'running')) {
        await condition(allHandlersFinished);
        await continueAsNew<typeof runWorkflow>({
          spec: this.run.spec,
          ...(this.run.parentRunId ? { parentRunId: this.run.parentRunId } : {}),
          carried: this.run,
        });
      }
      const agent = this.run.spec.agent;
      const { driver, ...agentRest } = agent;
      const step = await this.whileIdle(
        shared.agentStep({ driver, runId: this.run.runId, agent: agentRest, state: this.run.checkpoint.state, lastResult: this.run.lastResult }),
      );
      this.run.checkpoint = { state: step.state, stepIndex: this.run.checkpoint.stepIndex + 1, hashes: this.run.hashes };
      this.run.lastResult = await this.perform(step.action);
    }
    await this.finish();
  }

  /** Pauses (freezes) the sandbox when the agent goes quiet for policy.idleTimeout. */
  private async whileIdle<T>(work: Promise<T>): Promise<T> {
    const idle = this.run.spec.policy?.idleTimeout;
    if (!idle || this.idlePaused || this.run.jobs.some((j) => j.status === 'running')) return work;
    let done = false;
    void work.then(
      () => (done = true),
      () => (done = true),
    );
    if (!(await condition(() => done, durationMs(idle)))) {
      await this.sandbox.op('pause');
      this.idlePaused = true;
    }
    return work;
  }

  private async wake(): Promise<void> {
    if (!this.idlePaused) return;
    await this.sandbox.op('resume');
    this.idlePaused = false;
  }

  private async perform(action: AgentAction): Promise<unknown> {
    switch (action.type) {
      case 'job':
        return this.runJob(action);
      case 'interaction':
        return this.ask(action);
      case 'hold':
        await this.suspendAndWait('POLICY_HOLD', []);
        return { held: action.reason };
      case 'spawn':
        return this.spawn(action.spec);
      case 'writeFile':
        await this.wake();
        await this.sandbox.writeFile(action.path, action.content, 'utf8');
        return { path: action.path, written: true };
      case 'readFile': {
        await this.wake();
        const content = await this.sandbox.readFile(action.path, 'utf8').catch((err: unknown) => {
          if (failureCode(err) === 'NOT_FOUND') return undefined;
          throw err;
        });
        return { path: action.path, content };
      }
      case 'complete':
        // COMPLETED only once children and the sandbox are settled (finish()).
        this.completed = { output: action.output };
        return action.output;
      case 'fail':
        this.run.error = { code: action.code, message: action.message };
        this.run.status = 'FAILED';
        this.changed();
        return undefined;
    }
  }

  private async runJob(action: Extract<AgentAction, { type: 'job' }>): Promise<unknown> {
    const job = {
      id: `job-${++this.run.jobCounter}`,
      command: action.command,
      pauseBehavior: action.pauseBehavior,
      executionAffinity: action.executionAffinity,
      background: action.background,
      status: 'running' as const,
    };
    this.run.jobs.push({ ...job });
    const state = this.run.jobs[this.run.jobs.length - 1];
    if (job.executionAffinity === 'SANDBOX') await this.wake();
    const scope = new CancellationScope();
    this.jobScopes.set(job.id, scope);
    const done = scope
      .run(() =>
        job.executionAffinity === 'EXTERNAL'
          ? shared.runExternalJob({ command: job.command })
          : this.sandbox.exec(job.id, job.command),
      )
      .then(
        (result) => {
          state.status = 'succeeded';
          return { jobId: job.id, ...result };
        },
        (err: unknown) => {
          state.status = isCancellation(err) ? 'cancelled' : 'failed';
          if (!job.background) throw err;
          return { jobId: job.id, error: failureMessage(err) };
        },
      )
      .finally(() => {
        this.jobScopes.delete(job.id);
        this.changed();
      });
    if (job.background) {
      void done.catch(() => undefined);
      return { jobId: job.id, background: true };
    }
    return done;
  }

  private async ask(action: Extract<AgentAction, { type: 'interaction' }>): Promise<unknown> {
    const interaction: InteractionRequest = {
      id: `int-${this.run.interactions.length + 1}`,
      kind: action.kind,
      prompt: action.prompt,
      ...(action.options ? { options: action.options } : {}),
      createdAt: nowIso(),
      status: 'pending',
    };
    this.run.interactions.push(interaction);
    this.run.status = 'WAITING';
    this.changed();
    await this.suspendAndWait('INTERACTION', [interaction.id]);
    return interaction.response;
  }

  private async spawn(spec: RunSpec): Promise<unknown> {
    const childId = spec.runId ?? `${this.run.runId}.child-${this.run.children.length + 1}`;
    this.run.children.push({ runId: childId, state: 'PROVISIONING' });
    this.changed();
    const handle = await startChild(runWorkflow, {
      workflowId: childId,
      args: [{ spec: { ...spec, runId: childId }, parentRunId: this.run.runId }],
      parentClosePolicy: ParentClosePolicy.REQUEST_CANCEL,
      staticSummary: `Stasis child Run of ${this.run.runId}`,
    });
    void handle.result().catch((err: unknown) => log.info('child run ended without output', { childId, error: failureMessage(err) }));
    return { runId: childId };
  }

  /**
   * SUSPENDING → SUSPENDED: choose the pause mode, cancel CANCEL jobs, release
   * compute (blocked while CONTINUE/DETACH jobs or children hold it), then wait for
   * the answer, a resume, or retention expiry; RESUMING brings the sandbox back.
   */
  private async suspendAndWait(reason: SuspensionReason, interactionIds: string[]): Promise<void> {
    this.manualSuspendRequested = false;
    this.resumeRequested = false;
    this.run.phase = 'SUSPENDING';
    this.changed();
    const decision = choosePauseMode({
      reason,
      workspace: this.run.spec.sandbox.workspace?.kind ?? 'isolated',
      ...(this.run.spec.policy?.pauseMode ? { policyPauseMode: this.run.spec.policy.pauseMode } : {}),
      advertised: this.sandbox.capabilities?.pauseModes ?? [],
    });
    const retentionSeconds = this.run.spec.policy?.suspendedRetentionSeconds ?? DEFAULT_RETENTION_SECONDS;
    this.run.suspension = {
      reason,
      pauseMode: decision.kind === 'release' ? decision.mode : decision.wanted,
      since: nowIso(),
      hashes: this.run.hashes,
      interactionIds,
      ...(retentionSeconds > 0 ? { expiresAt: new Date(nowMs() + retentionSeconds * 1000).toISOString() } : {}),
    };
    for (const job of jobsToCancel(this.run.jobs)) this.jobScopes.get(job.id)?.cancel();
    if (decision.kind === 'retain') {
      this.sandbox.record.state = 'RETAINED';
      this.sandbox.record.lastError = `retained: ${decision.why}`;
    } else {
      this.sandbox.startRelease(decision.mode, reason, this.labels(), () => isReleaseBlocked(this.run.jobs, this.run.children));
    }
    this.run.phase = 'SUSPENDED';
    this.changed();

    const resumed = () =>
      reason === 'INTERACTION'
        ? interactionIds.every((id) => this.run.interactions.find((i) => i.id === id)?.status !== 'pending')
        : this.resumeRequested;
    const answered = retentionSeconds > 0 ? await condition(resumed, retentionSeconds * 1000) : (await condition(resumed), true);
    if (!answered) {
      await this.expire();
      return;
    }
    await this.resume();
  }

  private labels(): Record<string, string> {
    return { runhash: this.run.hashes.run, spechash: this.run.hashes.spec, policyhash: this.run.hashes.policy };
  }

  private async resume(): Promise<void> {
    this.run.phase = 'RESUMING';
    this.changed();
    const restored = await this.sandbox.resume();
    this.idlePaused = false;
    const now = computeRunHashes(this.run.runId, this.run.spec, this.run.parentRunId);
    const stored = restored?.labels
      ? { run: restored.labels.runhash, spec: restored.labels.spechash, policy: restored.labels.policyhash }
      : undefined;
    const bad = hashMismatches(now, this.run.suspension?.hashes, this.run.checkpoint.hashes, stored);
    if (bad.length > 0) {
      throw ApplicationFailure.create({
        type: 'RESUME_HASH_MISMATCH',
        message: `run: ${bad.join(', ')} hash changed while suspended; refusing to continue`,
        nonRetryable: true,
      });
    }
    this.run.suspension = undefined;
    this.run.phase = 'ACTIVE';
    this.changed();
  }

  /** Retention expiry: compute released if it was not, checkpoint deleted, interactions expired. */
  private async expire(): Promise<void> {
    await this.releaseKeepingNothing();
    for (const i of this.run.interactions) if (i.status === 'pending') i.status = 'expired';
    this.run.status = 'EXPIRED';
    this.run.error = { code: 'SUSPEND_EXPIRED', message: 'suspended longer than the retention period' };
    this.changed();
  }

  private async releaseKeepingNothing(): Promise<void> {
    if (this.sandbox.record.state === 'RETAINED') {
      await this.sandbox.destroy();
    } else {
      await this.sandbox.settleRelease();
      const checkpoint = this.sandbox.record.checkpoint;
      if (this.sandbox.record.state !== 'RELEASED' || this.sandbox.record.pauseMode === 'DETACH') await this.sandbox.destroy();
      if (checkpoint) await shared.deleteCheckpoint({ uri: checkpoint.uri });
    }
  }

  /** A finished Run waits for its children's compute, then destroys its own sandbox. */
  private async finish(): Promise<void> {
    if (!this.completed) {
      await this.endWith(() => this.sandbox.destroy());
      return;
    }
    // Children first: their Runs end and their compute is released before the parent completes.
    await condition(
      () =>
        blockingChildren(this.run.children).length === 0 &&
        this.run.children.every((c) => isTerminal(this.run.childStatus[c.runId] ?? 'RUNNING')),
    );
    await this.endWith(() => this.sandbox.destroy());
    this.run.output = this.completed.output;
    this.run.status = 'COMPLETED';
    this.changed();
  }

  private async endTtl(): Promise<void> {
    for (const i of this.run.interactions) if (i.status === 'pending') i.status = 'cancelled';
    this.run.status = 'EXPIRED';
    this.run.error = { code: 'TTL_EXPIRED', message: `run exceeded its ttl of ${this.run.spec.policy?.ttl}` };
    await this.endWith(() => this.releaseKeepingNothing());
  }

  private async endCancelled(): Promise<void> {
    for (const i of this.run.interactions) if (i.status === 'pending') i.status = 'cancelled';
    this.run.status = 'CANCELLED';
    await this.endWith(() => this.releaseCompute('cancelled'));
  }

  private async endFailed(code: string, message: string): Promise<void> {
    this.run.status = 'FAILED';
    this.run.error = { code, message };
    // Keep the workspace (and any checkpoint) of a failed Run; only its compute goes.
    await this.endWith(() => this.releaseCompute(code));
  }

  /** Releases compute but keeps the workspace: a snapshot where files are not host-persistent. */
  private async releaseCompute(reason: string): Promise<void> {
    await this.sandbox.cancelRelease();
    const state = this.sandbox.record.state;
    if (state === 'RELEASED' || state === 'DESTROYED' || this.sandbox.record.fence === 0) return;
    const decision = choosePauseMode({
      reason: 'MANUAL',
      workspace: this.run.spec.sandbox.workspace?.kind ?? 'isolated',
      advertised: this.sandbox.capabilities?.pauseModes ?? [],
    });
    if (decision.kind === 'retain') {
      await this.sandbox.destroy();
      return;
    }
    if (state !== 'ACTIVE' && state !== 'RETAINED' && state !== 'RELEASE_BLOCKED' && state !== 'RELEASING') {
      await this.sandbox.resume();
    }
    this.sandbox.record.fence += 1;
    await this.sandbox.releaseNow(decision.mode, reason, this.labels());
  }

  private async endWith(cleanup: () => Promise<void>): Promise<void> {
    for (const scope of this.jobScopes.values()) scope.cancel();
    this.run.phase = 'ACTIVE';
    this.run.suspension = undefined;
    this.changed();
    try {
      await cleanup();
    } catch (err) {
      this.run.record.lastError = failureMessage(err);
    }
    this.changed();
  }
}

/** The Run's suspend and resume take no argument; junk in one is refused, not ignored. */
function noArguments(update: string, args: unknown[]): void {
  const arity = checkArity(update, args, 0);
  if (arity) throw ApplicationFailure.create({ type: arity.code, message: arity.message, nonRetryable: true });
}

function newAggregate(workflowId: string, input: RunWorkflowInput): SessionAggregate {
  const hashes = computeRunHashes(workflowId, input.spec, input.parentRunId);
  return {
    runId: workflowId,
    spec: input.spec,
    ...(input.parentRunId ? { parentRunId: input.parentRunId } : {}),
    hashes,
    status: 'RUNNING',
    phase: 'ACTIVE',
    interactions: [],
    answeredBy: {},
    checkpoint: { state: undefined, stepIndex: 0, hashes },
    record: {
      sandboxId: `${workflowId}-sbx`.replace(/[^A-Za-z0-9._-]/g, '-'),
      provider: input.spec.sandbox.provider,
      state: 'PROVISIONING',
      fence: 0,
      attempts: 0,
    },
    jobs: [],
    children: [],
    childStatus: {},
    jobCounter: 0,
  };
}
