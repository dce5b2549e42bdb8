import type {
  ExecutionResourceRecord,
  Hashes,
  InteractionAnswer,
  InteractionRequest,
  ResourceView,
  RunError,
  RunPhase,
  RunSnapshot,
  RunSpec,
  RunStatus,
  Suspension,
} from '../common/schemas';
import { utf8Bytes } from '../common/wire-checks';
import type { Capabilities } from '../providers/api';
import { isTerminalRunStatus, type AnsweredBy, type ChildState, type JobState } from './lifecycle';
import type { ActionEntry } from './run-external';

/** The agent driver's opaque state after its last step, plus the step index and the hashes it was taken under. */
export interface AgentCheckpoint {
  state: unknown;
  stepIndex: number;
  hashes: Hashes;
}

/** The Run's durable state. Temporal history is its store; continue-as-new carries it whole. */
export interface SessionAggregate {
  runId: string;
  spec: RunSpec;
  parentRunId?: string;
  hashes: Hashes;
  status: RunStatus;
  phase: RunPhase;
  interactions: InteractionRequest[];
  answeredBy: Record<string, AnsweredBy>;
  checkpoint: AgentCheckpoint;
  lastResult?: unknown;
  suspension?: Suspension;
  record: ExecutionResourceRecord;
  capabilities?: Capabilities;
  jobs: JobState[];
  children: ChildState[];
  /** Each child's last reported Run status; a parent finishes after its children do. */
  childStatus: Record<string, RunStatus>;
  output?: unknown;
  error?: RunError;
  /** Absolute time (ms) at which policy.ttl ends the Run; kept across continue-as-new. */
  ttlDeadlineMs?: number;
  jobCounter: number;
  /** Interactions asked so far (ids stay unique when old ones are no longer carried). */
  interactionCount?: number;
  /** Webhook deliveries started so far (their ids stay unique across continue-as-new). */
  webhookCount?: number;
  /** The sandbox was frozen by policy.idleTimeout; the next job thaws it. Kept across continue-as-new. */
  idlePaused?: boolean;
  /** An external agent's recent actions, bounded (run-external.ts), kept across continue-as-new. */
  actions?: ActionEntry[];
}

/** The aggregate a continued Run takes up: the carried one with the spec of the input. */
export const takeUp = (carried: CarriedAggregate, spec: RunSpec): SessionAggregate => ({
  ...carried,
  spec: carried.spec ?? spec,
});

/** Read-only views of the aggregate: the user snapshot never shows resource state. */
export function toSnapshot(run: SessionAggregate): RunSnapshot {
  return {
    runId: run.runId,
    status: run.status,
    interactions: shownInteractions(run.interactions),
    ...(run.output !== undefined ? { output: run.output } : {}),
    ...(run.error ? { error: run.error } : {}),
    ...(run.parentRunId ? { parentRunId: run.parentRunId } : {}),
    childRunIds: run.children.map((c) => c.runId),
  };
}

export function toResourceView(run: SessionAggregate, nowMs: number): ResourceView {
  const blockedSince = run.record.blockedSince ? Date.parse(run.record.blockedSince) : undefined;
  return {
    runId: run.runId,
    phase: run.phase,
    record: run.record,
    ...(run.suspension ? { suspension: run.suspension } : {}),
    children: run.children,
    ...(blockedSince !== undefined
      ? { blockedAgeSeconds: Math.max(0, Math.round((nowMs - blockedSince) / 1000)) }
      : {}),
  };
}

/** Children whose Run has not ended (by its own report, or closed unreported). */
export const liveChildren = (run: SessionAggregate): ChildState[] =>
  run.children.filter((ch) => !ch.closed && !isTerminalRunStatus(run.childStatus[ch.runId] ?? 'RUNNING'));

/** What the agent receives for an answered interaction. */
export function toAnswer(interaction: InteractionRequest): InteractionAnswer {
  return {
    interactionId: interaction.id,
    ...(interaction.response as Omit<InteractionAnswer, 'interactionId' | 'respondedBy'>),
    ...(interaction.respondedBy ? { respondedBy: interaction.respondedBy } : {}),
  };
}

export const pendingInteractions = (run: SessionAggregate): InteractionRequest[] =>
  run.interactions.filter((i) => i.status === 'pending');

export { isTerminalRunStatus as isTerminal } from './lifecycle';

/** Settled interactions a Run shows and carries through continue-as-new, besides the pending ones (the newest). */
export const CARRIED_INTERACTIONS = 100;
/**
 * UTF-8 bytes of settled interactions (as JSON) a Run shows and carries whole, newest first. One
 * interaction may hold a megabyte of reviewed command and another of answer: unbounded, three of them
 * made the Run's snapshot too large to answer and its continue-as-new too large for Temporal, which
 * terminated the Run (its sandbox left behind).
 */
export const SETTLED_WHOLE_BYTES = 256 * 1024;
/** How much of its prompt a settled interaction past SETTLED_WHOLE_BYTES keeps. */
export const FORGOTTEN_PROMPT_CHARS = 1_000;

/** JSON size of a settled interaction (measured each time: shared workflow modules keep no state of their own). */
const bytesOf = (interaction: InteractionRequest): number => utf8Bytes(JSON.stringify(interaction));

/**
 * The interactions a Run shows (its snapshot) and carries through continue-as-new: every pending one
 * whole; of the settled ones the newest CARRIED_INTERACTIONS, whole while they fit SETTLED_WHOLE_BYTES
 * (newest first), older ones without their bulky content (forgetContent).
 */
export function shownInteractions(interactions: InteractionRequest[]): InteractionRequest[] {
  const settled = interactions.filter((i) => i.status !== 'pending');
  const keep = new Set(settled.slice(-CARRIED_INTERACTIONS));
  const shown = interactions.filter((i) => i.status === 'pending' || keep.has(i));
  let bytes = 0;
  for (let i = shown.length - 1; i >= 0; i--) {
    if (shown[i].status === 'pending') continue;
    bytes += bytesOf(shown[i]);
    if (bytes > SETTLED_WHOLE_BYTES) shown[i] = forgetContent(shown[i]);
  }
  return shown;
}

/**
 * A settled interaction without what can be large: the reviewed action, details, the answer's input,
 * edited action and comment; its prompt cut to FORGOTTEN_PROMPT_CHARS. Kept: who was asked what kind
 * of question, its status, the decision or option chosen, who answered and when.
 */
export function forgetContent(interaction: InteractionRequest): InteractionRequest {
  const { action: _action, details: _details, response, prompt, ...rest } = interaction;
  const answer = (response ?? {}) as { decision?: unknown; option?: unknown };
  const kept = {
    ...(answer.decision !== undefined ? { decision: answer.decision } : {}),
    ...(answer.option !== undefined ? { option: answer.option } : {}),
  };
  return {
    ...rest,
    prompt: prompt.length > FORGOTTEN_PROMPT_CHARS ? prompt.slice(0, FORGOTTEN_PROMPT_CHARS) : prompt,
    ...(response !== undefined ? { response: kept } : {}),
    contentForgotten: true,
  };
}

/** The aggregate as continue-as-new carries it: its spec goes once, as the input's (Runs before carried both). */
export type CarriedAggregate = Omit<SessionAggregate, 'spec'> & { spec?: RunSpec };

/**
 * What continue-as-new carries: the aggregate without what no later step needs, so
 * the carried state stays bounded however long the Run: finished jobs are dropped
 * (their results went to the agent), and settled interactions as shownInteractions keeps them.
 */
export function carriedAggregate(run: SessionAggregate): CarriedAggregate {
  const { spec: _spec, ...rest } = run;
  const interactions = shownInteractions(run.interactions);
  const ids = new Set(interactions.map((i) => i.id));
  return {
    ...rest,
    interactions,
    interactionCount: run.interactionCount ?? run.interactions.length,
    answeredBy: Object.fromEntries(Object.entries(run.answeredBy).filter(([id]) => ids.has(id))),
    jobs: run.jobs.filter((j) => j.status === 'running'),
  };
}
