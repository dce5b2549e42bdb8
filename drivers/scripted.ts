import { z } from 'zod';
import { Step } from '../common/schemas';
import type { AgentAction, AgentDriver, AgentStepOutput } from './api';

// The scripted driver walks `spec.agent.steps`. It is what the demo and tests use.

const State = z.object({
  index: z.number().int().nonnegative(),
  /** What the previous action asked for, checked against the result of it. */
  awaiting: z
    .discriminatedUnion('kind', [
      z.object({ kind: z.literal('expect'), path: z.string(), content: z.string() }),
      z.object({
        kind: z.literal('ask'),
        onDeny: z.enum(['fail', 'continue']),
        /** The ask reviewed a command: an `edit` answer replaces the next exec step's command. */
        gatesCommand: z.boolean().optional(),
      }),
    ])
    .optional(),
  /** The command a person edited, run in place of the next exec step's. */
  editedCommand: z.string().optional(),
});
type State = z.infer<typeof State>;

const Agent = z.object({ steps: z.array(Step) });

export const scriptedDriver: AgentDriver = {
  name: 'scripted',
  async step({ agent, state, lastResult }) {
    const { steps } = Agent.parse(agent);
    const current: State = state === undefined ? { index: 0 } : State.parse(state);
    const check = checkAwaited(current, lastResult);
    if (check) return { action: check, state: { index: current.index } };
    return next(steps, current.index, lastResult, editedCommand(current, lastResult) ?? current.editedCommand);
  },
};

/** The command of an `edit` answer to an ask that reviewed a command. */
function editedCommand(state: State, lastResult: unknown): string | undefined {
  if (state.awaiting?.kind !== 'ask' || !state.awaiting.gatesCommand) return undefined;
  const answer = lastResult as { decision?: unknown; action?: { command?: unknown } } | undefined;
  const command = answer?.decision === 'edit' ? answer.action?.command : undefined;
  return typeof command === 'string' ? command : undefined;
}

function checkAwaited(state: State, lastResult: unknown): AgentAction | undefined {
  const awaiting = state.awaiting;
  if (!awaiting) return undefined;
  if (awaiting.kind === 'expect') {
    const content = (lastResult as { content?: unknown } | undefined)?.content;
    if (content !== awaiting.content) {
      return {
        type: 'fail',
        code: 'EXPECT_FILE_MISMATCH',
        message: `${awaiting.path}: expected ${JSON.stringify(awaiting.content)}, found ${JSON.stringify(content)}`,
      };
    }
    return undefined;
  }
  const decision = (lastResult as { decision?: unknown } | undefined)?.decision;
  if (decision === 'deny' && awaiting.onDeny === 'fail') {
    return { type: 'fail', code: 'DENIED', message: 'the interaction was denied' };
  }
  return undefined;
}

function next(steps: Step[], index: number, lastResult: unknown, edited: string | undefined): AgentStepOutput {
  const step = steps[index];
  const advance = (action: AgentAction, awaiting?: State['awaiting']): AgentStepOutput => ({
    action,
    // An edited command waits for the next exec step, which takes it.
    state: {
      index: index + 1,
      ...(awaiting ? { awaiting } : {}),
      ...(edited !== undefined && !(step && 'exec' in step) ? { editedCommand: edited } : {}),
    },
  });
  if (!step) return advance({ type: 'complete', output: lastResult });
  if ('exec' in step) {
    return advance({
      type: 'job',
      command: edited ?? step.exec,
      pauseBehavior: step.pauseBehavior ?? 'CANCEL',
      executionAffinity: step.executionAffinity ?? 'SANDBOX',
      background: step.background ?? false,
    });
  }
  if ('ask' in step) {
    const { ask: prompt, kind, onDeny, ...fields } = step;
    // A later ask that reviews the command shows the one that will run: an earlier approver's edit,
    // not the step's original (a second approver was shown `echo ORIGINAL`, approved it, and the
    // edited command ran).
    if (edited !== undefined && fields.action?.command !== undefined)
      fields.action = { ...fields.action, command: edited };
    return advance(
      { type: 'interaction', kind: kind ?? 'approval', prompt, ...fields },
      // A denied gate must not fall through silently: a denial fails the Run unless the step says continue.
      {
        kind: 'ask',
        onDeny: onDeny ?? 'fail',
        ...(fields.action?.command !== undefined ? { gatesCommand: true } : {}),
      },
    );
  }
  if ('spawn' in step) return advance({ type: 'spawn', spec: step.spawn });
  if ('hold' in step) return advance({ type: 'hold', reason: step.hold });
  if ('writeFile' in step) return advance({ type: 'writeFile', ...step.writeFile });
  if ('expectFile' in step) {
    return advance({ type: 'readFile', path: step.expectFile.path }, { kind: 'expect', ...step.expectFile });
  }
  return advance({ type: 'complete', output: step.complete });
}
