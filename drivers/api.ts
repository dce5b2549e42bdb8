import { z } from 'zod';
import {
  checkInteractionSpec,
  ExecutionAffinity,
  InteractionFields,
  InteractionKind,
  PauseBehavior,
  RunSpec,
  WorkspacePath,
} from '../common/schemas';

// An agent driver is called once per step with its checkpoint and the last
// result, and answers one action (docs/DESIGN.md, Runs).

export const AgentAction = z.discriminatedUnion('type', [
  z.object({
    type: z.literal('job'),
    command: z.string().min(1),
    pauseBehavior: PauseBehavior.default('CANCEL'),
    executionAffinity: ExecutionAffinity.default('SANDBOX'),
    background: z.boolean().default(false),
  }),
  z
    .object({
      type: z.literal('interaction'),
      kind: InteractionKind,
      prompt: z.string().min(1),
      // title, details, action, options, accepts (README, "Approvals")
      ...InteractionFields,
    })
    .superRefine(checkInteractionSpec),
  z.object({ type: z.literal('spawn'), spec: RunSpec }),
  z.object({ type: z.literal('hold'), reason: z.string().min(1) }),
  z.object({ type: z.literal('writeFile'), path: WorkspacePath, content: z.string() }),
  z.object({ type: z.literal('readFile'), path: WorkspacePath }),
  z.object({ type: z.literal('complete'), output: z.unknown() }),
  z.object({ type: z.literal('fail'), code: z.string().default('AGENT_FAILED'), message: z.string() }),
]);
export type AgentAction = z.infer<typeof AgentAction>;

export interface AgentStepInput {
  runId: string;
  /** spec.agent without the driver name: `{steps}` for scripted, `{input}` otherwise. */
  agent: unknown;
  /** The driver's own state after its last step; undefined on the first call. */
  state: unknown;
  lastResult: unknown;
}

export interface AgentStepOutput {
  action: AgentAction;
  state: unknown;
}

export interface AgentDriver {
  name: string;
  step(input: AgentStepInput): Promise<AgentStepOutput>;
}
