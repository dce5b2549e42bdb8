import type { Client, WorkflowHandle } from '@temporalio/client';

// Reading a workflow's history as timed events: the source of the precise
// suspend/resume timings (event timestamps are taken by the server) and of the
// breakdown of where time goes (queue waits vs activity run vs workflow tasks).

type History = Awaited<ReturnType<WorkflowHandle['fetchHistory']>>;
type RawEvent = NonNullable<History['events']>[number];

export interface TimedEvent {
  id: number;
  /** e.g. ActivityTaskScheduled, WorkflowTaskCompleted, WorkflowExecutionUpdateAccepted */
  type: string;
  timeMs: number;
  /** Activity type, on ActivityTaskScheduled/Started/Completed (the latter two via their scheduled event). */
  activity?: string;
  scheduledId?: number;
}

function eventType(event: RawEvent): string {
  for (const [key, value] of Object.entries(event)) {
    if (key.endsWith('EventAttributes') && value) {
      const name = key.slice(0, -'EventAttributes'.length);
      return name[0].toUpperCase() + name.slice(1);
    }
  }
  return 'Unknown';
}

function toMs(ts: RawEvent['eventTime']): number {
  if (!ts) return 0;
  return Number(ts.seconds ?? 0) * 1000 + (ts.nanos ?? 0) / 1e6;
}

export async function timedHistory(temporal: Client, workflowId: string): Promise<TimedEvent[]> {
  const history = await temporal.workflow.getHandle(workflowId).fetchHistory();
  const events: TimedEvent[] = [];
  const activityOf = new Map<number, string>();
  for (const raw of history.events ?? []) {
    const id = Number(raw.eventId ?? 0);
    const type = eventType(raw);
    const event: TimedEvent = { id, type, timeMs: toMs(raw.eventTime) };
    // A local activity (the scripted driver's step) is a marker, named after its type in its details.
    if (raw.markerRecordedEventAttributes?.markerName === 'core_local_activity') event.activity = 'local activity';
    const scheduled = raw.activityTaskScheduledEventAttributes;
    if (scheduled) {
      event.activity = scheduled.activityType?.name ?? undefined;
      if (event.activity) activityOf.set(id, event.activity);
    }
    const ref =
      raw.activityTaskStartedEventAttributes?.scheduledEventId ??
      raw.activityTaskCompletedEventAttributes?.scheduledEventId ??
      raw.activityTaskFailedEventAttributes?.scheduledEventId ??
      raw.activityTaskCanceledEventAttributes?.scheduledEventId ??
      raw.activityTaskTimedOutEventAttributes?.scheduledEventId;
    if (ref !== undefined && ref !== null) {
      event.scheduledId = Number(ref);
      event.activity = activityOf.get(event.scheduledId);
    }
    events.push(event);
  }
  return events;
}

/** History length and size as the server counts them (what continue-as-new suggestions use). */
export async function historyStats(temporal: Client, workflowId: string): Promise<{ events: number; bytes: number }> {
  const description = await temporal.workflow.getHandle(workflowId).describe();
  const info = description.raw.workflowExecutionInfo;
  return { events: Number(info?.historyLength ?? 0), bytes: Number(info?.historySizeBytes ?? 0) };
}

export function find(events: TimedEvent[], predicate: (e: TimedEvent) => boolean, after = 0): TimedEvent {
  const found = events.find((e) => e.id > after && predicate(e));
  if (!found) throw new Error(`history has no matching event after #${after}`);
  return found;
}

/** Where the time between two events went, from the events in between. */
export interface Breakdown {
  /** Workflow task scheduled → started: waiting for the worker to pick up workflow code. */
  workflowTaskQueueMs: number;
  /** Workflow task started → completed: workflow code and the SDK's round trip. */
  workflowTaskRunMs: number;
  /** Activity scheduled → started, by activity type. */
  activityQueueMs: Record<string, number>;
  /** Activity started → completed, by activity type. */
  activityRunMs: Record<string, number>;
  /** The rest: server persistence and the gaps between one event and the next task. */
  otherMs: number;
  totalMs: number;
}

export function breakdown(events: TimedEvent[], fromId: number, toId: number): Breakdown {
  const byId = new Map(events.map((e) => [e.id, e]));
  const from = byId.get(fromId);
  const to = byId.get(toId);
  if (!from || !to) throw new Error(`no events #${fromId}..#${toId}`);
  const start = from.timeMs;
  const end = to.timeMs;
  const clip = (a: number, b: number) => Math.max(0, Math.min(b, end) - Math.max(a, start));
  const result: Breakdown = {
    workflowTaskQueueMs: 0,
    workflowTaskRunMs: 0,
    activityQueueMs: {},
    activityRunMs: {},
    otherMs: 0,
    totalMs: end - start,
  };
  let wftScheduled: number | undefined;
  let wftStarted: number | undefined;
  for (const e of events) {
    if (e.type === 'WorkflowTaskScheduled') wftScheduled = e.timeMs;
    if (e.type === 'WorkflowTaskStarted') {
      if (wftScheduled !== undefined) result.workflowTaskQueueMs += clip(wftScheduled, e.timeMs);
      wftStarted = e.timeMs;
    }
    if (
      (e.type === 'WorkflowTaskCompleted' || e.type === 'WorkflowTaskFailed' || e.type === 'WorkflowTaskTimedOut') &&
      wftStarted !== undefined
    ) {
      result.workflowTaskRunMs += clip(wftStarted, e.timeMs);
      wftStarted = undefined;
    }
    if (e.type === 'ActivityTaskStarted' && e.scheduledId !== undefined && e.activity) {
      const scheduled = byId.get(e.scheduledId);
      if (scheduled) add(result.activityQueueMs, e.activity, clip(scheduled.timeMs, e.timeMs));
      const closed = events.find((c) => c.scheduledId === e.scheduledId && c.type !== 'ActivityTaskStarted');
      if (closed) add(result.activityRunMs, e.activity, clip(e.timeMs, closed.timeMs));
    }
  }
  const accounted =
    result.workflowTaskQueueMs + result.workflowTaskRunMs + sum(result.activityQueueMs) + sum(result.activityRunMs);
  result.otherMs = Math.max(0, result.totalMs - accounted);
  return result;
}

function add(into: Record<string, number>, key: string, ms: number): void {
  into[key] = (into[key] ?? 0) + ms;
}

export function sum(values: Record<string, number>): number {
  return Object.values(values).reduce((a, b) => a + b, 0);
}

/** Counts of event types in a slice of history. */
export function countTypes(events: TimedEvent[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const e of events) counts[e.type] = (counts[e.type] ?? 0) + 1;
  return counts;
}

/** Where the time of the last timed-out activity went: "<type>: queued N ms, ran M ms before it timed out". */
export function lastTimeout(events: TimedEvent[]): string | undefined {
  const timedOut = events.filter((e) => e.type === 'ActivityTaskTimedOut').pop();
  if (!timedOut?.scheduledId) return undefined;
  const scheduled = events.find((e) => e.id === timedOut.scheduledId);
  const started = events.find((e) => e.type === 'ActivityTaskStarted' && e.scheduledId === timedOut.scheduledId);
  if (!scheduled || !started) return undefined;
  return `${timedOut.activity}: queued ${Math.round(started.timeMs - scheduled.timeMs)} ms, ran ${Math.round(timedOut.timeMs - started.timeMs)} ms before it timed out`;
}
