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
import { pendingMemo, withoutLabels, withRunLabels } from '../common/interactions';
import { jsonBytes, PAYLOAD_MAX_BYTES } from '../common/payload-limits';
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
  /**
   * Whether the worker that provisioned the sandbox delivers webhooks (undefined: not told). Kept across
   * continue-as-new: a continued Run that forgot it started a delivery workflow per notification.
   */
  webhooks?: boolean;
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
    // With the Run's labels, each counted in the budget: an older one shows none (forgetContent).
    interactions: shownInteractions(run.interactions.map((i) => withRunLabels(i, run.spec.labels))),
    ...(run.output !== undefined ? { output: run.output } : {}),
    ...(run.error ? { error: run.error } : {}),
    ...(run.parentRunId ? { parentRunId: run.parentRunId } : {}),
    childRunIds: run.children.map((c) => c.runId),
  };
}

export function toResourceView(run: SessionAggregate, nowMs: number, waitingFor?: string): ResourceView {
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
    ...(waitingFor !== undefined ? { waitingFor } : {}),
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
    bytes += jsonBytes(shown[i]);
    if (bytes > SETTLED_WHOLE_BYTES) shown[i] = forgetContent(shown[i]);
  }
  return shown;
}

/**
 * A settled interaction without what can be large: the reviewed action, details, the answer's input,
 * edited action and comment, the Run's labels (a copy an interaction asked before carried; the Run
 * has them); its prompt cut to FORGOTTEN_PROMPT_CHARS. Kept: who was asked what kind of question, its
 * status, the decision or option chosen, who answered and when.
 */
export function forgetContent(interaction: InteractionRequest): InteractionRequest {
  const { action: _action, details: _details, labels: _labels, response, prompt, ...rest } = interaction;
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

/** What a Run continues as new with (RunWorkflowInput). */
export interface ContinueInput {
  spec: RunSpec;
  parentRunId?: string;
  carried: CarriedAggregate;
}

/**
 * The most UTF-8 bytes of JSON a Run continues as new with, spec included: well under Temporal's
 * 2 MiB payload limit (over it, Temporal terminates the Run, its sandbox left behind), with room for
 * the payload's metadata. A spec takes at most 1 MiB through the API.
 */
export const CARRIED_INPUT_MAX_BYTES = PAYLOAD_MAX_BYTES;

/**
 * The most UTF-8 bytes of JSON an interaction takes in a payload of its own a Run sends: the respond
 * Update's result, a webhook delivery's input (with the Run's labels), a suspend's or resume's result
 * (the snapshot). Under Temporal's 2 MiB payload limit (over it the workflow task fails and Temporal
 * terminated the Run: labels up to 1 MiB, a reviewed command and an answer up to 1 MiB each can all be
 * in one), and 1 MiB, not 1.5, because one workflow task's completion is one gRPC message of at most
 * 4 MiB: the task that takes an answer holds the respond Update's input (up to the 1 MiB input limit),
 * its result and the interaction.answered delivery; at 1.5 MiB each they came to over 4 MiB, the task
 * failed on each try and the answer got a 500. Now at most 1 + 1 + 1 MiB and the memo
 * (PENDING_MEMO_MAX_BYTES); with continue-as-new's input (CARRIED_INPUT_MAX_BYTES) instead of a
 * delivery (it waits for delivery starts), 3.5 MiB.
 */
export const INTERACTION_PAYLOAD_MAX_BYTES = 1024 * 1024;

/**
 * The most UTF-8 bytes of JSON the snapshot query answers with (fitSnapshot): a query's answer is no
 * command, so it has the room of any payload of its own.
 */
export const SNAPSHOT_QUERY_MAX_BYTES = PAYLOAD_MAX_BYTES;

/**
 * The most UTF-8 bytes of JSON the memo of a Run's pending interactions takes. The memo is a command
 * of the workflow task that asks, which also holds the Update's input that sent the ask (up to the
 * 1 MiB input limit) and the webhook delivery's input (up to INTERACTION_PAYLOAD_MAX_BYTES): the memo
 * held the interaction whole with the Run's labels (up to 2 MB), and the three together passed
 * gRPC's 4 MiB message limit, so the task failed and the ask came back as a bare 500. It only lists
 * what waits on a person: the Run's snapshot has the rest.
 */
export const PENDING_MEMO_MAX_BYTES = 64 * 1024;

/**
 * The memo of pending interactions (`whole`, pendingMemo: diffs cut) within PENDING_MEMO_MAX_BYTES: past it,
 * every entry goes without its bulk and labels (forgetContent, `contentForgotten: true`, which a
 * pending interaction otherwise never has), and the client reads that Run's snapshot for them whole.
 */
export function fitPendingMemo(
  pending: InteractionRequest[],
  whole: (InteractionRequest & { diffTruncated?: true })[] = pendingMemo(pending),
): (InteractionRequest & { diffTruncated?: true })[] {
  if (jsonBytes(whole) <= PENDING_MEMO_MAX_BYTES) return whole;
  return pending.map((i) => forgetContent(i));
}

/**
 * The snapshot (the answer to the snapshot query) within `maxBytes` of JSON: past it, the oldest
 * settled interactions are left out until it fits, as those past CARRIED_INTERACTIONS are (shown
 * ones already go without their bulk past SETTLED_WHOLE_BYTES, but keep title, options and 1,000
 * characters of prompt: fifty of them in control characters, six bytes each in JSON, and one pending
 * ask reviewing a 1 MB command made an answer Temporal refused); then the pending interactions'
 * copies of the Run's labels. Pending interactions are never left out: a snapshot still over
 * (their reviewed actions alone) is refused, and the client names the Run as unreadable. Pure. A
 * query answer is no command: bounding it changes no history.
 */
export function fitSnapshot(snapshot: RunSnapshot, maxBytes: number = SNAPSHOT_QUERY_MAX_BYTES): RunSnapshot {
  let total = jsonBytes(snapshot);
  if (total <= maxBytes) return snapshot;
  const interactions = [...snapshot.interactions];
  const fitted: RunSnapshot = { ...snapshot, interactions };
  total = dropOldestSettled(interactions, total, maxBytes, () => jsonBytes(fitted));
  return total <= maxBytes ? fitted : { ...fitted, interactions: interactions.map(withoutLabels) };
}

/**
 * The snapshot a suspend or resume Update answers with, within `maxBytes`: fitSnapshot, then, if
 * still over, every interaction without its bulk (forgetContent, pending ones too). An Update's result
 * past Temporal's limit fails the workflow task and Temporal terminates the Run, where a query's
 * answer only fails (fitSnapshot keeps pending interactions whole, so an approver never sees a
 * command cut short). The whole Run stays readable with the snapshot query. Pure.
 */
export function fitSnapshotResult(
  snapshot: RunSnapshot,
  maxBytes: number = INTERACTION_PAYLOAD_MAX_BYTES,
): RunSnapshot {
  const fitted = fitSnapshot(snapshot, maxBytes);
  return jsonBytes(fitted) <= maxBytes ? fitted : { ...fitted, interactions: fitted.interactions.map(forgetContent) };
}

/**
 * The continue-as-new input within `maxBytes` (UTF-8 bytes of its JSON, spec included), forgetting
 * what a later step can do without, oldest first, until it fits: the copies of the Run's labels in its
 * interactions, then settled interactions' content (forgetContent), then settled interactions
 * themselves (their ids stay used: interactionCount), and only then action results (resultForgotten,
 * the newest too). Results go last because an agent may not have read them yet (an ask answered just
 * before continue-as-new), while a settled interaction was already answered, delivered and recorded
 * in the history. Never forgotten: the spec, pending interactions, action entries and their
 * outcomes' codes, an action not yet performed (its body), jobs, children, the agent's checkpoint and
 * last result. `fits` is false when even that minimum is larger than `maxBytes`. Pure: `input` is not
 * changed.
 */
export function fitContinueInput(
  input: ContinueInput,
  maxBytes: number = CARRIED_INPUT_MAX_BYTES,
): { input: ContinueInput; fits: boolean } {
  let total = jsonBytes(input);
  if (total <= maxBytes) return { input, fits: true };
  const carried: CarriedAggregate = {
    ...input.carried,
    interactions: input.carried.interactions.map(withoutLabels),
    answeredBy: { ...input.carried.answeredBy },
    ...(input.carried.actions ? { actions: [...input.carried.actions] } : {}),
  };
  const fitted: ContinueInput = { ...input, carried };
  total = jsonBytes(fitted);
  // Each step replaces one item and lowers the total by exactly what that item's JSON lost.
  const list = carried.interactions;
  for (let i = 0; i < list.length && total > maxBytes; i++) {
    if (!isSettled(list[i]) || list[i].contentForgotten) continue;
    const forgotten = forgetContent(list[i]);
    total -= jsonBytes(list[i]) - jsonBytes(forgotten);
    list[i] = forgotten;
  }
  total = dropOldestSettled(
    list,
    total,
    maxBytes,
    () => jsonBytes(fitted),
    (dropped) => {
      if (!Object.hasOwn(carried.answeredBy, dropped.id)) return 0;
      const saved = jsonBytes(dropped.id) + jsonBytes(carried.answeredBy[dropped.id]) + 2;
      delete carried.answeredBy[dropped.id];
      return saved;
    },
  );
  const actions = carried.actions ?? [];
  for (let i = 0; i < actions.length && total > maxBytes; i++) {
    const entry = actions[i];
    if (entry.result === undefined) continue;
    const { result: _result, resultChars: _chars, resultBytes: _bytes, ...rest } = entry;
    const forgotten: ActionEntry = { ...rest, resultForgotten: true };
    total -= jsonBytes(entry) - jsonBytes(forgotten);
    actions[i] = forgotten;
  }
  return { input: fitted, fits: total <= maxBytes };
}

const isSettled = (interaction: InteractionRequest): boolean => interaction.status !== 'pending';

/**
 * Drops the oldest settled interactions of `list` (in place) while the estimated `total` is over
 * `maxBytes`, then measures `whole()` (the JSON bytes of what holds the list) again, as dropping only
 * estimates the separators around what it dropped; until it fits or no settled one is left. `onDrop`
 * forgets what else names a dropped one and returns the bytes that saved. Returns the last `whole()`.
 */
function dropOldestSettled(
  list: InteractionRequest[],
  total: number,
  maxBytes: number,
  whole: () => number,
  onDrop: (dropped: InteractionRequest) => number = () => 0,
): number {
  for (;;) {
    while (total > maxBytes && list.some(isSettled)) {
      const [dropped] = list.splice(list.findIndex(isSettled), 1);
      total -= jsonBytes(dropped) + 1 + onDrop(dropped); // and its comma
    }
    total = whole();
    if (total <= maxBytes || !list.some(isSettled)) return total;
  }
}
