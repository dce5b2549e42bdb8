import {
  ApplicationFailure,
  allHandlersFinished,
  condition,
  currentUpdateInfo,
  continueAsNew,
  log,
  patched,
  proxyActivities,
  setHandler,
  sleep,
  workflowInfo,
} from '@temporalio/workflow';
import type { UpdateDefinition } from '@temporalio/common';
import type { Activities } from '../activities';
import { durationMs } from '../common/duration';
import { FILE_LIMIT_BYTES, fitsInTask, inputTooLarge, jsonBytes } from '../common/payload-limits';
import type { SandboxView } from '../common/schemas';
import { ExecutionBindingLifecycleCoordinator } from './coordinator';
import { failureCode, failureMessage, refuse, refuseForNow } from './failures';
import {
  destroySandboxUpdate,
  execSandboxUpdate,
  pauseSandboxUpdate,
  readFileUpdate,
  reconcileSignal,
  resumeSandboxUpdate,
  sandboxQuery,
  sandboxReadyUpdate,
  sandboxWorkflowId,
  startSandboxUpdate,
  stopSandboxUpdate,
  suspendSandboxUpdate,
  writeFileUpdate,
  type SandboxWorkflowInput,
} from './definitions';
import {
  checkArity,
  choosePauseMode,
  continueAsNewDue,
  decideExec,
  decideFileAccess,
  decideHistoryRoom,
  decideSandboxOp,
  type HistoryFacts,
  type SandboxCall,
  type SandboxOp,
} from './lifecycle';
import { sandboxFacts, toSandboxView, type SandboxAggregate } from './sandbox-aggregate';
import { nowIso, nowMs } from './clock';
import { Publisher } from './visibility';
import type { ReconcileInput } from '../common/schemas';
import {
  execInputIssues,
  readFileInputIssues,
  reconcileInputIssues,
  writeFileInputIssues,
  type WireIssue,
} from '../common/wire-checks';
import { describeIssues, END_REASON, isErrorCode, nonRetryableErrorTypes, type Rejection } from '../common/errors';

const shared = proxyActivities<Activities>({
  startToCloseTimeout: '5m',
  retry: { maximumInterval: '1m', nonRetryableErrorTypes: nonRetryableErrorTypes() },
});

/** A suspend whose release failed for good is refused with the release's error (it used to answer `suspended`). */
const PATCH_SUSPEND_OUTCOME = 'suspend-outcome';

/** Continue-as-new only when the sandbox is quiet after every handler finished (it used to check before waiting). */
const PATCH_CAN_RECHECK = 'continue-as-new-recheck';

/** File reads and writes count as busy and as activity (they used to do neither). */
const PATCH_FILE_BUSY = 'file-ops-busy';

/** Destroy and retention expiry delete every checkpoint of the sandbox (they used to delete the latest only). */
const PATCH_ALL_CHECKPOINTS = 'all-checkpoints';

/** Retention expiry destroys the sandbox, never waiting for a release (it used to wait, forever when the host was gone). */
const PATCH_RETENTION_DESTROYS = 'retention-expiry-destroys';
/**
 * A provisioning that failed for good leaves the sandbox `failed` with its error (shown and listed so) and
 * answers `ready` with the failure before the workflow fails. Sandboxes before this failed their workflow
 * still `created` in every list, and create's `ready` failed as "Workflow completed before the Update
 * completed" (an INTERNAL error). Asked for only when a provisioning fails.
 */
const PATCH_PROVISION_FAILED = 'provision-failed-shown';

/**
 * Continue-as-new is due also when the history keeps no room for one more call, or its events are
 * past their mark (continueAsNewDue), not at Temporal's suggestion alone (a server may suggest late,
 * or never: a quiet sandbox then refused every exec for good). Asked for at the start of a run, with
 * PATCH_CAN_RECHECK. A run from before it refuses calls past the room too, and continues as new at
 * Temporal's suggestion only; until then it takes stop and destroy, which beats being terminated at
 * 50 MiB with its sandbox left behind.
 *
 * Refusing calls needs no patch: that is done in Update validators only, and a validator's refusal
 * is no command and no event (the Update is never recorded), while on replay validators do not run
 * (the SDK runs them only for Updates that are new). Recorded histories replay as before.
 */
const PATCH_CAN_AT_HISTORY_GUARD = 'continue-as-new-at-history-guard';

/**
 * A large Update result or activity input waits for the next workflow task when the current one
 * already carries TASK_PAYLOADS_MAX_BYTES (fitsInTask): several ending together made a task
 * completion past gRPC's 4 MB, refused again and again, and the sandbox was stuck. Asked for only
 * then (a sandbox workflow has no local activity, after which a first patch() would not replay).
 */
const PATCH_TASK_ROOM = 'task-payload-room';

/** How long a suspend update waits for the receipt before answering with the state so far. */
const SUSPEND_ANSWER_MS = 60_000;

/** A standalone sandbox (docs/DESIGN.md, Sandboxes): an entity workflow around the coordinator. */
export async function sandboxWorkflow(input: SandboxWorkflowInput): Promise<SandboxView> {
  return new SandboxEntity(input).run();
}

class SandboxEntity {
  readonly s: SandboxAggregate;
  readonly sandbox: ExecutionBindingLifecycleCoordinator;
  private changing = false;
  private runningExecs = 0;
  private fileOps = 0;
  private ready: boolean;
  /** Set when provisioning failed for good (PATCH_PROVISION_FAILED): what `ready` answers. */
  private provisionFailure: Rejection | undefined;
  /** Bumped on every change so the main loop re-plans its timers. */
  private epoch = 0;
  /** Payload bytes the current workflow task (by its history length) has put in its commands. */
  private taskPayloads = { task: -1, bytes: 0 };
  /** PATCH_CAN_AT_HISTORY_GUARD, once asked at the start of the run. */
  private canAtHistoryGuard = false;
  private readonly publisher = new Publisher();

  constructor(private readonly input: SandboxWorkflowInput) {
    this.s = input.carried ?? {
      sandboxId: input.sandboxId,
      create: input.create,
      createdAt: nowIso(),
      state: 'created',
      record: {
        sandboxId: input.sandboxId,
        provider: input.create.provider,
        state: 'PROVISIONING',
        fence: 0,
        attempts: 0,
      },
      expired: false,
      lastActivityMs: nowMs(),
      ...(input.create.policy?.ttl ? { ttlDeadlineMs: nowMs() + durationMs(input.create.policy.ttl) } : {}),
    };
    this.ready = input.carried !== undefined;
    this.sandbox = new ExecutionBindingLifecycleCoordinator(
      this.s.record,
      {
        ownerId: sandboxWorkflowId(this.s.sandboxId),
        provider: this.s.create.provider,
        ...(this.s.create.template ? { template: this.s.create.template } : {}),
        ...(this.s.create.env ? { env: this.s.create.env } : {}),
        workspace: this.s.create.workspace ?? { kind: 'isolated' },
        ...(this.s.create.limits ? { limits: this.s.create.limits } : {}),
      },
      () => this.changed(),
    );
    if (this.s.capabilities) this.sandbox.capabilities = this.s.capabilities;
    this.setHandlers();
  }

  private facts() {
    return sandboxFacts(this.s, this.changing, this.runningExecs, this.fileOps);
  }

  private view(): SandboxView {
    return toSandboxView(this.s);
  }

  private changed(): void {
    this.epoch += 1;
    this.publisher.sandbox(this.s);
  }

  private setHandlers(): void {
    setHandler(sandboxQuery, () => this.view());
    setHandler(
      sandboxReadyUpdate,
      async () => {
        await condition(() => this.ready || this.provisionFailure !== undefined);
        if (this.provisionFailure) refuse(this.provisionFailure);
        return this.view();
      },
      {
        validator: (...args: unknown[]) => {
          const arity = checkArity('ready', args, 0);
          if (arity) refuse(arity);
          this.checkHistoryRoom('ready');
        },
      },
    );
    this.transition(startSandboxUpdate, 'start', () => this.sandbox.op('start'));
    this.transition(stopSandboxUpdate, 'stop', () => this.sandbox.op('stop'));
    this.transition(
      pauseSandboxUpdate,
      'pause',
      () => this.sandbox.op('pause'),
      () => (this.sandbox.capabilities?.pause === false ? 'pause' : undefined),
    );
    this.transition(resumeSandboxUpdate, 'resume', () => this.resume());
    this.transition(
      suspendSandboxUpdate,
      'suspend',
      () => this.suspend(),
      () => (this.suspendDecision().kind === 'retain' ? 'suspend' : undefined),
    );
    this.transition(destroySandboxUpdate, 'destroy', () => this.destroy());

    setHandler(
      execSandboxUpdate,
      async (request) => {
        // The Update's id names the job: unique per sandbox across continue-as-new, and the same for a
        // client's retry of this Update, which the provider's job journal then answers without running it again.
        const jobId = `exec-${currentUpdateInfo()?.id ?? `${workflowInfo().runId}-${workflowInfo().historyLength}`}`;
        this.runningExecs += 1;
        this.s.lastActivityMs = nowMs();
        this.changed();
        try {
          await condition(() => this.ready || this.provisionFailure !== undefined);
          if (this.provisionFailure) refuse(this.provisionFailure);
          if (!this.takeTaskRoom(request)) await this.waitTaskRoom(request);
          const result = await this.sandbox.exec(jobId, request.command, {
            ...(request.timeoutMs ? { timeoutMs: request.timeoutMs } : {}),
            ...(request.env ? { env: request.env } : {}),
          });
          if (!this.takeTaskRoom(result)) await this.waitTaskRoom(result);
          return result;
        } catch (err) {
          this.failIfBroken(err);
          throw asFailure(err);
        } finally {
          this.runningExecs -= 1;
          this.s.lastActivityMs = nowMs();
          this.changed();
        }
      },
      {
        validator: (...args: unknown[]) => {
          // A raw Temporal client is not held to the typed client's limit: an input Temporal cannot
          // carry in the activity that runs it would fail every workflow task of this sandbox.
          const tooLarge = inputTooLarge('exec', args[0]);
          if (tooLarge) refuse({ code: 'PAYLOAD_TOO_LARGE', message: tooLarge });
          parseArgs('exec', args, execInputIssues);
          const rejection = decideExec(this.facts());
          if (rejection) refuse(rejection);
          this.checkHistoryRoom('exec');
        },
      },
    );

    setHandler(
      readFileUpdate,
      async ({ path }) => ({
        // Counted as under way (fileOp) until its result has room in a workflow task too.
        contentBase64: await this.fileOp(async () => {
          const content = await this.sandbox.readFile(path, 'base64');
          if (!this.takeTaskRoom(content)) await this.waitTaskRoom(content);
          return content;
        }),
      }),
      {
        validator: (...args: unknown[]) => {
          parseArgs('readFile', args, readFileInputIssues);
          this.checkFileAccess();
          this.checkHistoryRoom('readFile');
        },
      },
    );
    setHandler(
      writeFileUpdate,
      async ({ path, contentBase64 }) => {
        // Counted as under way (fileOp) while it waits for room in a workflow task too.
        await this.fileOp(async () => {
          if (!this.takeTaskRoom(contentBase64)) await this.waitTaskRoom(contentBase64);
          await this.sandbox.writeFile(path, contentBase64, 'base64');
        });
      },
      {
        validator: (...args: unknown[]) => {
          const content = (args[0] as { contentBase64?: unknown } | undefined)?.contentBase64;
          if (args.length === 1 && typeof content === 'string' && (content.length * 3) / 4 > FILE_LIMIT_BYTES) {
            refuse({
              code: 'PAYLOAD_TOO_LARGE',
              message: `file content must be at most ${FILE_LIMIT_BYTES} bytes`,
            });
          }
          parseArgs('writeFile', args, writeFileInputIssues);
          this.checkFileAccess();
          this.checkHistoryRoom('writeFile');
        },
      },
    );

    setHandler(reconcileSignal, (input) => {
      // Anyone can signal: a malformed report (say, `alive` missing) must not lose the sandbox.
      const issues = reconcileInputIssues(input);
      if (issues.length) {
        log.warn('reconcile rejected', { sandboxId: this.s.sandboxId, message: describeIssues(issues) });
        return;
      }
      const { hostId, alive } = input as ReconcileInput;
      if (alive || hostId !== this.s.record.hostId || this.changing) return;
      if (decideSandboxOp(this.facts(), 'lose').kind === 'transition') {
        this.s.state = 'lost';
        this.s.error = {
          code: END_REASON.LOST,
          message: `host ${hostId} restarted and the sandbox's processes did not survive`,
        };
        this.changed();
      }
    });
  }

  /**
   * A file read or write: counted as busy (a suspend waits for none, it is refused) and as
   * activity for the idle timer, from its start to its end.
   */
  private async fileOp<T>(fn: () => Promise<T>): Promise<T> {
    const counted = patched(PATCH_FILE_BUSY);
    this.s.lastActivityMs = nowMs();
    if (counted) {
      this.fileOps += 1;
      this.changed();
    }
    try {
      await condition(() => this.ready || this.provisionFailure !== undefined);
      if (this.provisionFailure) refuse(this.provisionFailure);
      return await fn();
    } catch (err) {
      throw asFailure(err);
    } finally {
      if (counted) {
        this.fileOps -= 1;
        this.s.lastActivityMs = nowMs();
        this.changed();
      }
    }
  }

  /**
   * Counts `payload` (its JSON `bytes`) into the current workflow task's commands if it fits
   * (fitsInTask); false if it has to wait for a later task (waitTaskRoom). Synchronous, so a payload
   * that fits is sent exactly when it was before.
   */
  private takeTaskRoom(payload: unknown, bytes: number = jsonBytes(payload)): boolean {
    const task = workflowInfo().historyLength;
    if (this.taskPayloads.task !== task) this.taskPayloads = { task, bytes: 0 };
    if (!fitsInTask(this.taskPayloads.bytes, bytes)) return false;
    this.taskPayloads.bytes += bytes;
    return true;
  }

  /** Waits for a workflow task with room for `payload` and counts it there (PATCH_TASK_ROOM). */
  private async waitTaskRoom(payload: unknown): Promise<void> {
    if (!patched(PATCH_TASK_ROOM)) return;
    const bytes = jsonBytes(payload);
    do await sleep(1);
    while (!this.takeTaskRoom(payload, bytes));
  }

  /** running → failed when the provider says the sandbox broke beyond repair. */
  private failIfBroken(err: unknown): void {
    if (failureCode(err) !== 'SANDBOX_FAILED') return;
    if (decideSandboxOp({ ...this.facts(), changing: false }, 'fail').kind !== 'transition') return;
    this.s.state = 'failed';
    this.s.error = { code: 'SANDBOX_FAILED', message: failureMessage(err) };
  }

  /**
   * Refuses, for now, a call that would add to a history that has to continue as new first
   * (decideHistoryRoom): checked last in each validator, after every refusal that is for good.
   */
  private checkHistoryRoom(call: SandboxCall): void {
    const rejection = decideHistoryRoom(this.history(), call, this.s.state);
    if (rejection) refuseForNow(rejection);
  }

  private history(): HistoryFacts {
    const info = workflowInfo();
    return {
      continueAsNewSuggested: info.continueAsNewSuggested,
      historySizeBytes: info.historySize,
      historyLength: info.historyLength,
      callsUnderWay: this.runningExecs + this.fileOps,
    };
  }

  private checkFileAccess(): void {
    const rejection = decideFileAccess(this.facts());
    if (rejection) refuse(rejection);
  }

  /** One update per state change; the validator rejects before anything is written to history. */
  private transition(
    def: UpdateDefinition<SandboxView, []>,
    op: SandboxOp & SandboxCall,
    perform: () => Promise<void>,
    unsupported: () => string | undefined = () => undefined,
  ): void {
    setHandler(
      def,
      async () => {
        const decision = decideSandboxOp(this.facts(), op);
        if (decision.kind !== 'transition') return this.view();
        this.changing = true;
        this.changed();
        try {
          await condition(() => this.ready || this.provisionFailure !== undefined);
          if (this.provisionFailure) refuse(this.provisionFailure);
          await perform();
          this.s.state = decision.to;
          this.s.lastActivityMs = nowMs();
          return this.view();
        } catch (err) {
          this.failIfBroken(err);
          throw asFailure(err);
        } finally {
          this.changing = false;
          this.changed();
        }
      },
      {
        validator: (...args: unknown[]) => {
          const arity = checkArity(op, args, 0);
          if (arity) refuse(arity);
          const decision = decideSandboxOp(this.facts(), op);
          if (decision.kind === 'reject') refuse(decision.rejection);
          const missing = decision.kind === 'transition' ? unsupported() : undefined;
          if (missing)
            refuse({
              code: 'NOT_SUPPORTED',
              message: `provider ${this.s.create.provider} does not support ${missing}`,
            });
          this.checkHistoryRoom(op);
        },
      },
    );
  }

  private suspendDecision() {
    return choosePauseMode({
      reason: 'MANUAL',
      workspace: this.s.create.workspace?.kind ?? 'isolated',
      advertised: this.sandbox.capabilities?.pauseModes ?? [],
    });
  }

  private async suspend(): Promise<void> {
    const decision = this.suspendDecision();
    if (decision.kind === 'retain') refuse({ code: 'NOT_SUPPORTED', message: decision.why });
    this.sandbox.startRelease(decision.mode, 'MANUAL', { sandboxid: this.s.sandboxId }, () => false);
    this.s.suspendedAtMs = nowMs();
    await condition(
      () => this.s.record.state === 'RELEASED' || this.s.record.lastError !== undefined,
      SUSPEND_ANSWER_MS,
    );
    if (!patched(PATCH_SUSPEND_OUTCOME)) return;
    // A release refused for good released nothing: the sandbox is not suspended.
    if (this.sandbox.releaseFailure !== undefined) {
      this.s.suspendedAtMs = undefined;
      throw this.sandbox.releaseFailure;
    }
    if (this.sandbox.releaseInFlight) void this.sandbox.settleRelease().then(() => this.unsuspendIfReleaseFailed());
  }

  /** A suspend answered while its release was still retrying: if that release then fails for good, the sandbox runs again. */
  private unsuspendIfReleaseFailed(): void {
    const failure = this.sandbox.releaseFailure;
    if (failure === undefined || this.sandbox.releaseInFlight) return;
    if (decideSandboxOp(this.facts(), 'unsuspend').kind !== 'transition') return;
    this.s.state = 'running';
    this.s.suspendedAtMs = undefined;
    this.s.lastActivityMs = nowMs();
    this.s.error = { code: failureCode(failure) ?? 'INTERNAL', message: `suspend failed: ${failureMessage(failure)}` };
    this.changed();
  }

  private async resume(): Promise<void> {
    if (this.s.state === 'paused') {
      await this.sandbox.op('resume');
      return;
    }
    await this.sandbox.resume();
    this.s.suspendedAtMs = undefined;
  }

  private async destroy(): Promise<void> {
    const checkpoint = this.s.record.checkpoint;
    const handoff = patched(PATCH_ALL_CHECKPOINTS);
    await this.sandbox.destroy();
    // The coordinator's destroy deletes every checkpoint of the sandbox now; it used to be only the latest, here.
    if (checkpoint && !handoff) await shared.deleteCheckpoint({ uri: checkpoint.uri });
  }

  async run(): Promise<SandboxView> {
    this.changed();
    if (!this.ready) {
      await this.sandbox.provision(false).catch((err: unknown) => this.provisionFailed(err));
      this.s.capabilities = this.sandbox.capabilities;
      this.ready = true;
      this.changed();
    }
    const recheck = patched(PATCH_CAN_RECHECK);
    this.canAtHistoryGuard = recheck && patched(PATCH_CAN_AT_HISTORY_GUARD);
    while (this.s.state !== 'destroyed') {
      if (recheck) {
        // Checked and acted on in one go: nothing can start between the check and continue-as-new.
        if (this.mayContinueAsNew()) await continueAsNew<typeof sandboxWorkflow>({ ...this.input, carried: this.s });
      } else if (workflowInfo().continueAsNewSuggested && this.quiet()) {
        await condition(allHandlersFinished);
        await continueAsNew<typeof sandboxWorkflow>({ ...this.input, carried: this.s });
      }
      const due = this.nextDeadline();
      const epoch = this.epoch;
      const wake = () => this.epoch !== epoch || (recheck && this.mayContinueAsNew());
      const woke = due ? await condition(wake, Math.max(1, due.atMs - nowMs())) : (await condition(wake), true);
      if (!woke && due) await this.onDeadline(due.kind);
    }
    await condition(allHandlersFinished);
    return this.view();
  }

  /**
   * created → failed: shown so, every call waiting for the provisioning (ready, exec, a file, a state
   * change) refused with the failure, then the workflow fails with it. Those calls wait inline with
   * `await condition(...)`: a helper of their own would add an await, and the order of commands in
   * recorded histories would change (nondeterminism on replay).
   */
  private async provisionFailed(err: unknown): Promise<never> {
    if (!patched(PATCH_PROVISION_FAILED)) throw err;
    const code = failureCode(err);
    const error: Rejection = {
      code: isErrorCode(code) ? code : 'INTERNAL',
      message: `provisioning failed: ${failureMessage(err)}`,
    };
    if (decideSandboxOp({ ...this.facts(), changing: false }, 'fail').kind === 'transition') {
      this.s.state = 'failed';
      this.s.error = error;
    }
    this.provisionFailure = error;
    this.changed();
    await condition(allHandlersFinished);
    throw err;
  }

  /** No state change, command or release is under way (what continue-as-new must not cut off). */
  private quiet(): boolean {
    return !this.changing && this.runningExecs === 0 && this.fileOps === 0 && !this.sandbox.releaseInFlight;
  }

  private mayContinueAsNew(): boolean {
    const history = this.history();
    const due = this.canAtHistoryGuard ? continueAsNewDue(history) : history.continueAsNewSuggested;
    return due && this.quiet() && allHandlersFinished();
  }

  private nextDeadline(): { kind: 'ttl' | 'idle' | 'retention'; atMs: number } | undefined {
    const candidates: { kind: 'ttl' | 'idle' | 'retention'; atMs: number }[] = [];
    if (this.s.ttlDeadlineMs !== undefined) candidates.push({ kind: 'ttl', atMs: this.s.ttlDeadlineMs });
    const timeout = this.s.create.policy?.timeout;
    if (timeout && this.s.state === 'running' && this.runningExecs === 0 && this.fileOps === 0 && !this.changing) {
      candidates.push({ kind: 'idle', atMs: this.s.lastActivityMs + durationMs(timeout) });
    }
    const retention = this.input.suspendedRetentionSeconds;
    if (this.s.state === 'suspended' && retention > 0 && !this.s.expired && this.s.suspendedAtMs !== undefined) {
      candidates.push({ kind: 'retention', atMs: this.s.suspendedAtMs + retention * 1000 });
    }
    return candidates.sort((a, b) => a.atMs - b.atMs)[0];
  }

  /** Suspended past retention: every call but destroy is a stale route. */
  private expire(): void {
    this.s.expired = true;
    this.s.error = { code: END_REASON.SUSPEND_EXPIRED, message: 'suspended longer than the retention period' };
  }

  /** Durable lifecycle timers: ttl destroys, idle timeout pauses, retention expires. */
  private async onDeadline(kind: 'ttl' | 'idle' | 'retention'): Promise<void> {
    await condition(() => !this.changing);
    this.changing = true;
    try {
      if (kind === 'ttl') {
        await this.destroy();
        this.s.state = 'destroyed';
        this.s.error = {
          code: END_REASON.TTL_EXPIRED,
          message: `sandbox exceeded its ttl of ${this.s.create.policy?.ttl}`,
        };
      } else if (
        kind === 'idle' &&
        this.s.state === 'running' &&
        this.runningExecs === 0 &&
        this.fileOps === 0 &&
        this.sandbox.capabilities?.pause !== false
      ) {
        await this.sandbox.op('pause');
        this.s.state = 'paused';
      } else if (kind === 'retention' && this.s.state === 'suspended' && patched(PATCH_RETENTION_DESTROYS)) {
        // Stale from here on. Nothing is kept, so no release is waited for (its host may be gone):
        // destroy cancels it, gives the host a bounded try (then its maintenance), and deletes the
        // checkpoints of every fence, also one a cancelled release uploaded without telling anyone.
        // The error says the expiry is done.
        this.s.expired = true;
        await this.sandbox.destroy();
        this.expire();
      } else if (kind === 'retention' && this.s.state === 'suspended') {
        await this.sandbox.settleRelease();
        const checkpoint = this.s.record.checkpoint;
        if (patched(PATCH_ALL_CHECKPOINTS)) await this.sandbox.deleteCheckpoints();
        else if (checkpoint) await shared.deleteCheckpoint({ uri: checkpoint.uri });
        this.expire();
      }
    } catch (err) {
      log.warn('lifecycle timer action failed', { kind, error: failureMessage(err) });
      this.s.record.lastError = failureMessage(err);
      this.s.lastActivityMs = nowMs();
    } finally {
      this.changing = false;
      this.changed();
    }
  }
}

/** An update's one argument, checked against its wire schema (and the update's arity) in the validator. */
function parseArgs(update: string, args: unknown[], check: (value: unknown) => WireIssue[]): void {
  const arity = checkArity(update, args, 1);
  if (arity) refuse(arity);
  const issues = check(args[0]);
  if (issues.length) refuse({ code: 'INVALID_ARGUMENT', message: `${update}: ${describeIssues(issues)}` });
}

/** Provider failures reach the caller with their code (e.g. NOT_FOUND for a missing file). */
function asFailure(err: unknown): unknown {
  if (err instanceof ApplicationFailure) return err;
  const code = failureCode(err);
  return ApplicationFailure.create({ type: code ?? 'INTERNAL', message: failureMessage(err), nonRetryable: true });
}
