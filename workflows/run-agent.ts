import {
  CancellationScope,
  ChildWorkflowFailure,
  ParentClosePolicy,
  TerminatedFailure,
  TimeoutFailure,
  allHandlersFinished,
  condition,
  continueAsNew,
  isCancellation,
  log,
  patched,
  startChild,
  workflowInfo,
} from '@temporalio/workflow';
import type { AgentAction } from '../drivers/api';
import { durationMs } from '../common/duration';
import type { InteractionRequest, RunSpec } from '../common/schemas';
import { failureCode, failureMessage } from './coordinator';
import type { RunWorkflowInput } from './definitions';
import { PATCH_CHILD_CLOSED_UNREPORTED, PATCH_CHILDREN_SURVIVE_CAN, shared, type RunController } from './run-controller';
import { carriedAggregate, isTerminal } from './run-state';
import { finish } from './run-ending';
import { suspendAndWait } from './run-suspension';
import { nowIso } from './clock';

// The agent loop: one driver step at a time, each answered by an action.

export async function agentLoop(c: RunController): Promise<void> {
  const run = c.run;
  if (run.record.state === 'PROVISIONING' && run.record.fence === 0) {
    await c.sandbox.provision(true);
    run.capabilities = c.sandbox.capabilities;
  }
  while (!isTerminal(run.status) && !c.completed) {
    if (c.manualSuspendRequested) {
      await suspendAndWait(c, 'MANUAL', []);
      continue;
    }
    if (workflowInfo().continueAsNewSuggested && !c.admit('continueAsNew')) {
      await condition(allHandlersFinished);
      await continueAsNew<(input: RunWorkflowInput) => Promise<unknown>>({
        spec: run.spec,
        ...(run.parentRunId ? { parentRunId: run.parentRunId } : {}),
        carried: carriedAggregate(run),
      });
    }
    const { driver, ...agentRest } = run.spec.agent;
    const step = await whileIdle(
      c,
      shared.agentStep({ driver, runId: run.runId, agent: agentRest, state: run.checkpoint.state, lastResult: run.lastResult }),
    );
    run.checkpoint = { state: step.state, stepIndex: run.checkpoint.stepIndex + 1, hashes: run.hashes };
    run.lastResult = await perform(c, step.action);
  }
  await finish(c);
}

/** Pauses (freezes) the sandbox when the agent goes quiet for policy.idleTimeout. */
async function whileIdle<T>(c: RunController, work: Promise<T>): Promise<T> {
  const idle = c.run.spec.policy?.idleTimeout;
  if (!idle || c.run.idlePaused || c.run.jobs.some((j) => j.status === 'running')) return work;
  let done = false;
  void work.then(
    () => (done = true),
    () => (done = true),
  );
  if (!(await condition(() => done, durationMs(idle)))) {
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
  switch (action.type) {
    case 'job':
      return runJob(c, action);
    case 'interaction':
      return ask(c, action);
    case 'hold':
      await suspendAndWait(c, 'POLICY_HOLD', []);
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

async function runJob(c: RunController, action: Extract<AgentAction, { type: 'job' }>): Promise<unknown> {
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
    .run(() => (job.executionAffinity === 'EXTERNAL' ? shared.runExternalJob({ command: job.command }) : c.sandbox.exec(job.id, job.command)))
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
  const interaction: InteractionRequest = {
    id: `int-${c.run.interactionCount}`,
    kind: action.kind,
    prompt: action.prompt,
    ...(action.options ? { options: action.options } : {}),
    createdAt: nowIso(),
    status: 'pending',
  };
  c.run.interactions.push(interaction);
  c.transition('ask');
  await suspendAndWait(c, 'INTERACTION', [interaction.id]);
  return interaction.response;
}

async function spawn(c: RunController, spec: RunSpec): Promise<unknown> {
  const run = c.run;
  const childId = spec.runId ?? `${run.runId}.child-${run.children.length + 1}`;
  run.children.push({ runId: childId, state: 'PROVISIONING' });
  c.changed();
  // A child outlives its parent's continue-as-new (REQUEST_CANCEL would cancel it then): the
  // parent cancels its children itself when it ends (endWith), and they report to its workflow id.
  const survivesContinueAsNew = patched(PATCH_CHILDREN_SURVIVE_CAN);
  const handle = await startChild('runWorkflow', {
    workflowId: childId,
    args: [{ spec: { ...spec, runId: childId }, parentRunId: run.runId } satisfies RunWorkflowInput],
    parentClosePolicy: survivesContinueAsNew ? ParentClosePolicy.ABANDON : ParentClosePolicy.REQUEST_CANCEL,
    staticSummary: `Stasis child Run of ${run.runId}`,
  });
  c.watchedChildren.add(childId);
  void handle.result().catch((err: unknown) => {
    log.info('child run ended without output', { childId, error: failureMessage(err) });
    if (!isTerminal(run.childStatus[childId] ?? 'RUNNING') && patched(PATCH_CHILD_CLOSED_UNREPORTED)) {
      c.childClosedUnreported(childId, closedWhy(err));
    }
  });
  return { runId: childId };
}

/** Why a child closed without its final report, from the failure its result gave. */
function closedWhy(err: unknown): string {
  const cause = err instanceof ChildWorkflowFailure ? err.cause : err;
  if (cause instanceof TerminatedFailure) return 'terminated';
  if (cause instanceof TimeoutFailure) return 'timed out';
  return `closed: ${failureMessage(err)}`;
}
