import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { GetObjectCommand, type S3Client } from '@aws-sdk/client-s3';
import type { Client, WorkflowHandle } from '@temporalio/client';
import type { StasisClient } from '../../client';
import type { Checkpoint, ResourceView, RunSpec } from '../../common/schemas';
import { eventually, saw } from '../helpers/stack';

// The fault areas import every shared check from here.
export { releasedView } from '../helpers/runs';

// Shared by the fault suite (test/faults): the one summary line per area, the
// figures behind it, and the checks every area makes of what a Run left behind.

type History = Awaited<ReturnType<WorkflowHandle['fetchHistory']>>;
export type HistoryEvent = NonNullable<History['events']>[number];

const SUMMARY_FILE = path.join(__dirname, '..', '..', 'test-artifacts', 'faults-summary.txt');

/**
 * Trials, faults and losses of one area. A trial counts as lost until the test
 * has verified it end to end (`ok`), so a trial that throws half way is a loss.
 */
export class Tally {
  trials = 0;
  faults = 0;
  private readonly open = new Map<string, string>();

  start(id: string, what = id): void {
    this.trials += 1;
    this.open.set(id, what);
  }

  inject(count = 1): void {
    this.faults += count;
  }

  ok(id: string): void {
    this.open.delete(id);
  }

  get lost(): number {
    return this.open.size;
  }

  /** What was not verified, for the failure message. */
  get lostItems(): string[] {
    return [...this.open.values()];
  }
}

/**
 * Writes `faults <area>: trials=N faults_injected=M items_lost=L [extra]` to
 * test-artifacts/faults-summary.txt (replacing that area's previous line) and prints it.
 */
export function writeSummary(area: string, tally: Tally, extra: Record<string, string | number> = {}): string {
  const line = [
    `faults ${area}: trials=${tally.trials} faults_injected=${tally.faults} items_lost=${tally.lost}`,
    ...Object.entries(extra).map(([k, v]) => `${k}=${v}`),
  ].join(' ');
  mkdirSync(path.dirname(SUMMARY_FILE), { recursive: true });
  let previous: string[] = [];
  try {
    previous = readFileSync(SUMMARY_FILE, 'utf8').split('\n').filter(Boolean);
  } catch {
    // first area of this checkout
  }
  const kept = previous.filter((l) => !l.startsWith(`faults ${area}:`));
  writeFileSync(SUMMARY_FILE, [...kept, line].join('\n') + '\n');
  console.log(line);
  return line;
}

export async function historyEvents(client: Client, workflowId: string): Promise<HistoryEvent[]> {
  return (await client.workflow.getHandle(workflowId).fetchHistory()).events ?? [];
}

/** Workflow tasks that failed (a handler or the workflow code threw where it must not). */
export function failedWorkflowTasks(events: HistoryEvent[]): HistoryEvent[] {
  return events.filter((e) => e.workflowTaskFailedEventAttributes);
}

/** Event ids of the scheduling of every activity of one type (or of several): completed and started events name them. */
function scheduledEventIds(events: HistoryEvent[], type: string | string[]): Set<string> {
  const types = [type].flat();
  return new Set(
    events
      .filter((e) => types.includes(e.activityTaskScheduledEventAttributes?.activityType?.name ?? ''))
      .map((e) => String(e.eventId)),
  );
}

/** Decoded results of the completed activities of one type (or of several), in history order. */
export function activityResults(events: HistoryEvent[], type: string | string[]): unknown[] {
  const scheduled = scheduledEventIds(events, type);
  return events
    .filter(
      (e) =>
        e.activityTaskCompletedEventAttributes &&
        scheduled.has(String(e.activityTaskCompletedEventAttributes.scheduledEventId)),
    )
    .map((e) => {
      const payload = e.activityTaskCompletedEventAttributes?.result?.payloads?.[0];
      return payload?.data ? (JSON.parse(Buffer.from(payload.data).toString('utf8')) as unknown) : undefined;
    });
}

/** The `attempt` of every started attempt of an activity type that was recorded (the last one of each activity). */
export function startedAttempts(events: HistoryEvent[], type: string): { attempt: number; lastFailure: string }[] {
  const scheduled = scheduledEventIds(events, type);
  return events
    .filter(
      (e) =>
        e.activityTaskStartedEventAttributes &&
        scheduled.has(String(e.activityTaskStartedEventAttributes.scheduledEventId)),
    )
    .map((e) => ({
      attempt: e.activityTaskStartedEventAttributes?.attempt ?? 0,
      lastFailure: JSON.stringify(e.activityTaskStartedEventAttributes?.lastFailure ?? {}),
    }));
}

/**
 * A workspace listing (type, mode, path, link target) and the sha-256 of every
 * file: run before the suspension and after the resume, equal output means the
 * workspace came back byte for byte.
 */
export const MANIFEST_COMMAND =
  "echo MANIFEST; find . -printf '%y %m %p %l\\n' | LC_ALL=C sort; find . -type f -exec sha256sum {} + | LC_ALL=C sort";

/**
 * A Run that builds a small workspace (text, random bytes, a link, an empty
 * directory), takes its manifest, asks, and after the answer takes the manifest
 * again and checks a file, then completes with `tag`.
 */
export function cycleSpec(
  tag: string,
  provider: string,
  options: { blobBytes?: number; policy?: RunSpec['policy'] } = {},
): RunSpec {
  const blob = options.blobBytes ?? 65_536;
  return {
    agent: {
      driver: 'scripted',
      steps: [
        { writeFile: { path: 'data/note.txt', content: `note ${tag}\n` } },
        {
          exec: `head -c ${blob} /dev/urandom > data/blob.bin && mkdir -p empty/dir && ln -s data/note.txt link && ${MANIFEST_COMMAND}`,
        },
        { ask: `continue ${tag}?` },
        { exec: MANIFEST_COMMAND },
        { expectFile: { path: 'data/note.txt', content: `note ${tag}\n` } },
        { complete: { tag } },
      ],
    },
    sandbox: { provider },
    ...(options.policy ? { policy: options.policy } : {}),
  };
}

/** The manifests a cycleSpec Run took before its suspension and after its resume. */
export function manifests(events: HistoryEvent[]): string[] {
  // The job right after a resume runs in the resume's own activity (resumeAndExecInSandbox), in its outcome.
  return activityResults(events, ['execInSandbox', 'resumeAndExecInSandbox'])
    .map((r) => {
      const result = r as { stdout?: string; outcome?: { stdout?: string } } | undefined;
      return result?.outcome?.stdout ?? result?.stdout ?? '';
    })
    .filter((s) => s.includes('MANIFEST'))
    .map((s) => s.slice(s.indexOf('MANIFEST')));
}

/** Both manifests present and equal, and the Run's file listing shows what the Run wrote. */
export function workspaceIntact(events: HistoryEvent[]): boolean {
  const [before, after, ...rest] = manifests(events);
  return (
    rest.length === 0 &&
    before !== undefined &&
    before === after &&
    before.includes('./data/blob.bin') &&
    before.includes('l 777 ./link data/note.txt')
  );
}

/** Waits until the Run's release has been tried `attempts` times and has failed, and returns that view. */
export async function failedReleaseView(
  client: StasisClient,
  runId: string,
  attempts: number,
  timeoutMs: number,
): Promise<ResourceView> {
  return eventually(
    async () => {
      const view = saw(await client.runs.resource(runId));
      return view.record.attempts >= attempts && view.record.lastError ? view : undefined;
    },
    timeoutMs,
    `${runId}: ${attempts} release attempts`,
  );
}

/** Downloads a checkpoint and checks its sha-256 and size against the record. */
export async function checkpointVerifies(s3: S3Client, checkpoint: Checkpoint): Promise<boolean> {
  const match = /^s3:\/\/([^/]+)\/(.+)$/.exec(checkpoint.uri);
  if (!match) return false;
  const object = await s3.send(new GetObjectCommand({ Bucket: match[1], Key: match[2] }));
  const bytes = Buffer.from((await object.Body?.transformToByteArray()) ?? []);
  return bytes.length === checkpoint.bytes && createHash('sha256').update(bytes).digest('hex') === checkpoint.sha256;
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Starts a Run that asks one question, and waits until it is WAITING on it. */
export async function startWaitingRun(client: StasisClient): Promise<string> {
  const { runId } = await client.runs.start({
    agent: { driver: 'scripted', steps: [{ ask: 'may I?' }, { complete: 'yes' }] },
    sandbox: { provider: 'local' },
  });
  await eventually(async () => saw(await client.runs.get(runId)).status === 'WAITING', 60_000, `${runId} waiting`);
  return runId;
}
