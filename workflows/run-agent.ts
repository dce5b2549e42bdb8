import {
  ApplicationFailure,
  CancellationScope,
  ChildWorkflowFailure,
  ParentClosePolicy,
  TerminatedFailure,
  TimeoutFailure,
  WorkflowIdReusePolicy,
  allHandlersFinished,
  condition,
  continueAsNew,
  isCancellation,
  log,
  startChild,
  workflowInfo,
} from '@temporalio/workflow';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import type { AgentAction } from '../drivers/api';
import { EXTERNAL_DRIVER } from '../common/external-actions';
import { durationMs } from '../common/duration';
import { END_REASON } from '../common/errors';
import { resolveAccepts } from '../common/interactions';
import type { InteractionRequest, RunSpec, SuspensionReason } from '../common/schemas';
import { failureCode, failureMessage } from './failures';
import { childRunId, plainChildRunId, type RunWorkflowInput } from './definitions';
import {
  PATCH_ANSWER_RESULT,
  PATCH_CAN_BRINGS_BACK,
  PATCH_CAN_YIELDS_TO_SUSPEND,
  PATCH_CARRIED_FITS,
  PATCH_CHILD_CLOSED_UNREPORTED,
  PATCH_CHILD_ID_FITS,
  PATCH_CHILDREN_SURVIVE_CAN,
  PATCH_FAILED_KEEPS,
  PATCH_RESERVES_ROOM,
  shared,
  type RunController,
} from './run-controller';
import {
  CARRIED_INPUT_MAX_BYTES,
  carriedAggregate,
  fitContinueInput,
  isTerminal,
  toAnswer,
  type ContinueInput,
} from './run-state';
import { finish } from './run-ending';
import { completeResume, keepsReleased, resumeWithJob, suspendAndWait, undoPendingResume } from './run-suspension';
import {
  fusesWithResume,
  HISTORY_LENGTH_HIGH_WATER,
  HISTORY_SIZE_HIGH_WATER_BYTES,
  RUN_ITEM_HISTORY_MAX_BYTES,
  waitsForJobs,
  type RunHistoryFacts,
} from './lifecycle';
import { drainWebhooks, notify } from './run-webhooks';
import { answerOf, nextAction, settleAction, type ActionEntry } from './run-external';
import { nowIso } from './clock';
import { jsonBytes } from '../common/payload-limits';

// The agent loop: one driver step at a time, each answered by an action.

export async function agentLoop(c: RunController): Promise<void> {
  const run = c.run;
  if (run.record.state === 'PROVISIONING' && run.record.fence === 0) {
    await c.sandbox.provision(true);
    run.capabilities = c.sandbox.capabilities;
    if (c.sandbox.webhooks !== undefined) run.webhooks = c.sandbox.webhooks;
  }
  while (!isTerminal(run.status) && !c.completed) {
    if (c.manualSuspendRequested) {
      c.publishHeld();
      await suspendAndWait(c, 'MANUAL', [], takesNextStep(c));
      continue;
    }
    // Continue-as-new waits for an ACTIVE Run: one that only asks is RESUMING between its steps.
    if (workflowInfo().continueAsNewSuggested && c.pendingResume && c.patched(PATCH_CAN_BRINGS_BACK)) {
      await completeResume(c);
      // A suspend asked for meanwhile goes first (the loop's top).
      if (c.patched(PATCH_CAN_YIELDS_TO_SUSPEND)) continue;
    }
    if (workflowInfo().continueAsNewSuggested && !c.admit('continueAsNew')) {
      c.publishHeld();
      if (c.patched(PATCH_CAN_YIELDS_TO_SUSPEND)) {
        // The suspend's handler waits for the Run to suspend: continue-as-new must not wait for it.
        await condition(() => (allHandlersFinished() && c.webhookStarts.size === 0) || c.manualSuspendRequested);
        if (c.manualSuspendRequested) continue;
      } else {
        await condition(allHandlersFinished);
        await drainWebhooks(c);
      }
      const input = continueInput(c);
      if (input) await continueAsNew<(input: RunWorkflowInput) => Promise<unknown>>(input);
    }
    // Backpressure: a Run whose history, with the room its running jobs and children may still fill,
    // reaches its high-water mark waits for one of them to end.
    if (waitsForJobs(historyFacts(c)) && c.patched(PATCH_RESERVES_ROOM)) {
      await waitForJobs(c);
      continue;
    }
    if (run.spec.agent.driver === EXTERNAL_DRIVER) {
      const entry = await whileIdle(c, nextAction(c));
      if (entry) await performAction(c, entry);
      continue;
    }
    const { driver, ...agentRest } = run.spec.agent;
    const step = await whileIdle(
      c,
      c.steps.agentStep({
        driver,
        runId: run.runId,
        agent: agentRest,
        state: run.checkpoint.state,
        lastResult: run.lastResult,
      }),
    );
    c.publishHeld();
    run.checkpoint = { state: step.state, stepIndex: run.checkpoint.stepIndex + 1, hashes: run.hashes };
    run.lastResult = await perform(c, step.action);
  }
  c.publishHeld();
  // A Run its agent failed keeps its sandbox where it is: a resume begun for its next action is given up.
  if (!c.completed && c.patched(PATCH_FAILED_KEEPS)) undoPendingResume(c);
  else await completeResume(c);
  await finish(c);
}

const runningJobIds = (c: RunController): string[] => c.run.jobs.filter((j) => j.status === 'running').map((j) => j.id);

function historyFacts(c: RunController): RunHistoryFacts {
  const { historySize, historyLength } = workflowInfo();
  return {
    historySize,
    historyLength,
    runningJobs: runningJobIds(c).length,
    runningChildren: c.childResultsDue.size,
  };
}

/**
 * Backpressure (PATCH_RESERVES_ROOM): no agent step until a running job or child ends and the room
 * they may still fill is left (waitsForJobs); then the Run steps on, or continues as new. A suspend
 * asked for meanwhile goes first (it cancels the jobs it does not keep), and a cancel ends the wait as
 * any other. The resource view says why the Run waits.
 */
async function waitForJobs(c: RunController): Promise<void> {
  c.publishHeld();
  const { historySize, historyLength } = workflowInfo();
  const ids = runningJobIds(c);
  const children = [...c.childResultsDue];
  const running = [
    ...(ids.length ? [`job${ids.length === 1 ? '' : 's'} ${ids.join(', ')}`] : []),
    ...(children.length ? [`child Run${children.length === 1 ? '' : 's'} ${children.join(', ')}`] : []),
  ].join('; ');
  c.waitingFor =
    `a running job or child Run to end (${running}): its history ` +
    `(${(historySize / 1024 / 1024).toFixed(1)} MiB, ${historyLength} events) with room for what each ` +
    `may still add (${(RUN_ITEM_HISTORY_MAX_BYTES / 1024 / 1024).toFixed(2)} MiB each) reaches its high-water mark ` +
    `(${HISTORY_SIZE_HIGH_WATER_BYTES / 1024 / 1024} MiB or ${HISTORY_LENGTH_HIGH_WATER} events), so it takes no further step until then`;
  log.info(`run waits for ${c.waitingFor}`, { runId: c.run.runId, jobIds: ids, childIds: children });
  try {
    await condition(() => !waitsForJobs(historyFacts(c)) || c.manualSuspendRequested);
  } finally {
    c.waitingFor = undefined;
  }
}

/** The Run's continue-as-new input; undefined when it goes on first (an action sent meanwhile, too large to carry). */
function continueInput(c: RunController): ContinueInput | undefined {
  const run = c.run;
  const input: ContinueInput = {
    spec: run.spec,
    ...(run.parentRunId ? { parentRunId: run.parentRunId } : {}),
    carried: carriedAggregate(run),
  };
  if (jsonBytes(input) <= CARRIED_INPUT_MAX_BYTES || !c.patched(PATCH_CARRIED_FITS)) return input;
  const fitted = fitContinueInput(input);
  if (fitted.fits) return fitted.input;
  if (run.actions?.some((a) => a.status === 'pending')) return undefined;
  throw ApplicationFailure.create({
    type: END_REASON.STATE_TOO_LARGE,
    message:
      `run: the state it must carry to continue as new is ${jsonBytes(fitted.input)} bytes, over ` +
      `${CARRIED_INPUT_MAX_BYTES} even with every result and settled interaction forgotten (its spec, ` +
      "its agent's state and last result, its children)",
    nonRetryable: true,
  });
}

/** The suspension an action goes into, if it does. */
function suspensionOf(action: AgentAction): SuspensionReason | undefined {
  if (action.type === 'interaction') return 'INTERACTION';
  if (action.type === 'hold') return 'POLICY_HOLD';
  return undefined;
}

/** The agent loop takes the Run's next action from a driver step: a resume may wait for it (fused). */
const takesNextStep = (c: RunController) => c.run.spec.agent.driver !== EXTERNAL_DRIVER;

/** Pauses (freezes) the sandbox when the agent goes quiet for policy.idleTimeout. */
async function whileIdle<T>(c: RunController, work: Promise<T>): Promise<T> {
  const idle = c.run.spec.policy?.idleTimeout;
  if (!idle || c.run.idlePaused || c.pendingResume || c.run.jobs.some((j) => j.status === 'running')) return work;
  let done = false;
  void work.then(
    () => (done = true),
    () => (done = true),
  );
  if (!(await condition(() => done, durationMs(idle)))) {
    c.publishHeld();
    await c.sandbox.op('pause');
    c.run.idlePaused = true;
  }
  return work;
}

async function wake(c: RunController): Promise<void> {
  if (!c.run.idlePaused) return;
  await c.sandbox.op('resume');
  c.run.idlePaused = false;
}

async function perform(c: RunController, action: AgentAction): Promise<unknown> {
  // A deferred resume goes with a sandbox job (runJob), is skipped by a suspension that keeps the
  // sandbox released as it is (suspendAndWait), and comes before anything else.
  // A `fail` ends the Run with its workspace kept where it is (finish()): nothing to bring back for it.
  const failsKept = action.type === 'fail' && c.patched(PATCH_FAILED_KEEPS);
  if (c.pendingResume && !failsKept && !fusesWithResume(action) && !keepsReleased(c, suspensionOf(action))) {
    await completeResume(c);
  }
  switch (action.type) {
    case 'job':
      return runJob(c, action);
    case 'interaction':
      return ask(c, action);
    case 'hold':
      await suspendAndWait(c, 'POLICY_HOLD', [], takesNextStep(c));
      return { held: action.reason };
    case 'spawn':
      return spawn(c, action.spec);
    case 'writeFile':
      await wake(c);
      await c.sandbox.writeFile(action.path, action.content, 'utf8');
      return { path: action.path, written: true };
    case 'readFile': {
      await wake(c);
      const content = await c.sandbox.readFile(action.path, 'utf8').catch((err: unknown) => {
        if (failureCode(err) === 'NOT_FOUND') return undefined;
        throw err;
      });
      return { path: action.path, content };
    }
    case 'complete':
      // COMPLETED only once children and the sandbox are settled (finish()).
      c.completed = { output: action.output };
      return action.output;
    case 'fail':
      c.run.error = { code: action.code, message: action.message };
      c.transition('fail');
      return undefined;
  }
}

/**
 * Performs an external agent's action and settles it with its result. A failed
 * exec, file access or spawn is the agent's to handle (the action fails, the Run
 * goes on); an ask, a cancellation or a failed resume end the Run as for any agent.
 */
async function performAction(c: RunController, entry: ActionEntry): Promise<void> {
  const run = c.run;
  const action = entry.action!;
  run.checkpoint = { state: undefined, stepIndex: run.checkpoint.stepIndex + 1, hashes: run.hashes };
  entry.status = 'running';
  c.changed();
  if (action.type === 'ask') {
    const { type: _type, ask: prompt, kind, ...fields } = action;
    const asking = perform(c, { type: 'interaction', kind: kind ?? 'approval', prompt, ...fields });
    // ask() opened the interaction before its first await.
    entry.interactionId = run.interactions[run.interactions.length - 1]?.id;
    entry.status = 'waiting';
    await asking;
    const answer = answerOf(run, entry.interactionId);
    if (answer !== undefined) settleAction(run, entry, { result: answer }, c.patched);
    return;
  }
  try {
    let result: unknown;
    if (action.type === 'exec') {
      const job = {
        type: 'job' as const,
        command: action.command,
        pauseBehavior: action.pauseBehavior ?? 'CANCEL',
        executionAffinity: action.executionAffinity ?? 'SANDBOX',
        background: false,
      };
      const { exitCode, stdout, stderr } = (await runJob(c, job, action.timeoutMs)) as Record<string, unknown>;
      result = { exitCode, stdout, stderr };
    } else if (action.type === 'complete') {
      result = { output: await perform(c, { type: 'complete', output: action.output }) };
    } else if (action.type === 'fail') {
      const failure = { code: action.code ?? END_REASON.AGENT_FAILED, message: action.message };
      await perform(c, { type: 'fail', ...failure });
      result = failure;
    } else {
      result = await perform(c, action);
    }
    settleAction(run, entry, { result }, c.patched);
  } catch (err) {
    if (isCancellation(err)) throw err;
    settleAction(
      run,
      entry,
      { error: { code: failureCode(err) ?? 'ACTION_FAILED', message: failureMessage(err) } },
      c.patched,
    );
  }
  c.changed();
}

async function runJob(
  c: RunController,
  action: Extract<AgentAction, { type: 'job' }>,
  timeoutMs?: number,
): Promise<unknown> {
  const run = c.run;
  const job = {
    id: `job-${++run.jobCounter}`,
    command: action.command,
    pauseBehavior: action.pauseBehavior,
    executionAffinity: action.executionAffinity,
    background: action.background,
    status: 'running' as const,
  };
  run.jobs.push({ ...job });
  const state = run.jobs[run.jobs.length - 1];
  if (job.executionAffinity === 'SANDBOX') await wake(c);
  const scope = new CancellationScope();
  c.jobScopes.set(job.id, scope);
  const done = scope
    .run(() =>
      job.executionAffinity === 'EXTERNAL'
        ? // Jailed like a sandbox of the Run's provider (providers/external-jobs.ts).
          shared.runExternalJob({
            command: job.command,
            provider: c.run.spec.sandbox.provider,
            ...(timeoutMs !== undefined ? { timeoutMs } : {}),
            ...(job.background ? { keepOutput: false as const } : {}),
          })
        : c.pendingResume
          ? // The sandbox comes back with this job, in one activity.
            resumeWithJob(c, job.id, job.command, timeoutMs !== undefined ? { timeoutMs } : {})
          : c.sandbox.exec(job.id, job.command, {
              ...(timeoutMs !== undefined ? { timeoutMs } : {}),
              // The Run throws a background job's output away: its result carries none.
              ...(job.background ? { keepOutput: false as const } : {}),
            }),
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
      c.jobScopes.delete(job.id);
      c.changed();
    });
  if (job.background) {
    void done.catch(() => undefined);
    return { jobId: job.id, background: true };
  }
  return done;
}

async function ask(c: RunController, action: Extract<AgentAction, { type: 'interaction' }>): Promise<unknown> {
  c.run.interactionCount = (c.run.interactionCount ?? c.run.interactions.length) + 1;
  const { type: _type, accepts: _accepts, ...fields } = action;
  // The Run's labels stay in its spec: the surfaces add them to what they show (withRunLabels).
  const interaction: InteractionRequest = {
    id: `int-${c.run.interactionCount}`,
    ...fields,
    accepts: resolveAccepts(action),
    createdAt: nowIso(),
    status: 'pending',
  };
  c.run.interactions.push(interaction);
  c.transition('ask');
  notify(c, 'interaction.opened', interaction);
  await suspendAndWait(c, 'INTERACTION', [interaction.id], takesNextStep(c));
  // The agent gets the answer with who gave it and to what (Runs asked before this get the bare response).
  return c.patched(PATCH_ANSWER_RESULT) ? toAnswer(interaction) : interaction.response;
}

/**
 * A spawn whose child could not start (its id is taken: by a live Run, or by one that ended, as ids are
 * never reused) registers no child and fails as ALREADY_EXISTS naming the id. Runs before this
 * registered the child before starting it and kept it after a failed start: cancelling the spawner
 * cancelled the other Run, and a completing spawner waited on it. Asked for only when a start fails.
 */
export const PATCH_SPAWN_FAILED_UNREGISTERED = 'stasis-run-spawn-failed-unregistered';

/** The id of the child a spawn starts: the one it gives, else its parent's child id by number. */
function childIdOf(c: RunController, spec: RunSpec): string {
  if (spec.runId !== undefined) return spec.runId;
  const n = c.run.children.length + 1;
  const fitting = childRunId(c.run.runId, n);
  const plain = plainChildRunId(c.run.runId, n);
  return fitting !== plain && c.patched(PATCH_CHILD_ID_FITS) ? fitting : plain;
}

async function spawn(c: RunController, spec: RunSpec): Promise<unknown> {
  const run = c.run;
  const childId = childIdOf(c, spec);
  // A child outlives its parent's continue-as-new (REQUEST_CANCEL would cancel it then): the
  // parent cancels its children itself when it ends (endWith), and they report to its workflow id.
  const survivesContinueAsNew = c.patched(PATCH_CHILDREN_SURVIVE_CAN);
  const handle = await startChild('runWorkflow', {
    workflowId: childId,
    // An id used before names another Run's sandbox and checkpoints: never started again.
    workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
    args: [{ spec: { ...spec, runId: childId }, parentRunId: run.runId } satisfies RunWorkflowInput],
    parentClosePolicy: survivesContinueAsNew ? ParentClosePolicy.ABANDON : ParentClosePolicy.REQUEST_CANCEL,
    staticSummary: `Stasis child Run of ${run.runId}`,
  }).catch((err: unknown) => startFailed(c, childId, err));
  registerChild(c, childId);
  c.watchedChildren.add(childId);
  // Its result reaches this workflow run's history when it ends: room is kept for it until then.
  c.childResultsDue.add(childId);
  void handle.result().then(
    () => void c.childResultsDue.delete(childId),
    (err: unknown) => {
      c.childResultsDue.delete(childId);
      log.info('child run ended without output', { childId, error: failureMessage(err) });
      if (!isTerminal(run.childStatus[childId] ?? 'RUNNING') && c.patched(PATCH_CHILD_CLOSED_UNREPORTED)) {
        c.childClosedUnreported(childId, closedWhy(err));
      }
    },
  );
  return { runId: childId };
}

/** A child's start failed: registered only as Runs before PATCH_SPAWN_FAILED_UNREGISTERED did (or if it may yet start). */
function startFailed(c: RunController, childId: string, err: unknown): never {
  // Cancelled while starting, the child may yet start: it stays registered, so the ending cancels it.
  if (isCancellation(err) || !c.patched(PATCH_SPAWN_FAILED_UNREGISTERED)) {
    registerChild(c, childId);
    throw err;
  }
  if (err instanceof WorkflowExecutionAlreadyStartedError) {
    throw ApplicationFailure.create({
      type: 'ALREADY_EXISTS',
      message: `run ${childId} already exists (a Run id is used once, also after its Run ended)`,
      nonRetryable: true,
    });
  }
  throw err;
}

/** Registers a started child (its first report may have come first and registered it already). */
function registerChild(c: RunController, childId: string): void {
  if (!c.run.children.some((ch) => ch.runId === childId))
    c.run.children.push({ runId: childId, state: 'PROVISIONING' });
  c.changed();
}

/** Why a child closed without its final report, from the failure its result gave. */
function closedWhy(err: unknown): string {
  const cause = err instanceof ChildWorkflowFailure ? err.cause : err;
  if (cause instanceof TerminatedFailure) return 'terminated';
  if (cause instanceof TimeoutFailure) return 'timed out';
  return `closed: ${failureMessage(err)}`;
}
