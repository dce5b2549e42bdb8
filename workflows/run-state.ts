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

/** Read-only views of the aggregate: the user snapshot never shows resource state. */
export function toSnapshot(run: SessionAggregate): RunSnapshot {
  return {
    runId: run.runId,
    status: run.status,
    interactions: run.interactions,
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

/** Settled interactions a Run carries through continue-as-new, besides the pending ones (the newest). */
export const CARRIED_INTERACTIONS = 100;

/**
 * What continue-as-new carries: the aggregate without what no later step needs, so
 * the carried state stays bounded however long the Run: finished jobs are dropped
 * (their results went to the agent), and only the newest settled interactions stay.
 */
export function carriedAggregate(run: SessionAggregate): SessionAggregate {
  const settled = run.interactions.filter((i) => i.status !== 'pending');
  const keep = new Set(settled.slice(-CARRIED_INTERACTIONS).map((i) => i.id));
  const interactions = run.interactions.filter((i) => i.status === 'pending' || keep.has(i.id));
  return {
    ...run,
    interactions,
    interactionCount: run.interactionCount ?? run.interactions.length,
    answeredBy: Object.fromEntries(
      Object.entries(run.answeredBy).filter(([id]) => interactions.some((i) => i.id === id)),
    ),
    jobs: run.jobs.filter((j) => j.status === 'running'),
  };
}
