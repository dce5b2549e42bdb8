import { WorkflowFailedError } from '@temporalio/client';
import type { BenchEnv } from './env';
import { lastTimeout, timedHistory } from './history';
import { mapLimit, sleep } from './stats';

// Many Runs at once, watched through Temporal visibility (one list call per
// poll for the whole fleet, instead of one query per Run).

export async function listIds(env: BenchEnv, query: string): Promise<Set<string>> {
  const ids = new Set<string>();
  for await (const wf of env.temporal.workflow.list({ query, pageSize: 1000 })) ids.add(wf.workflowId);
  return ids;
}

/**
 * A visibility clause limiting a query to the Runs of one phase (their ids share
 * the prefix `newRunId` gave them), so a poll does not list every Run of the bench.
 */
export function phaseClause(among: Set<string>): string {
  const [first] = among;
  const prefix = first?.slice(0, first.lastIndexOf('-') + 1) ?? '';
  if (prefix === '' || ![...among].every((id) => id.startsWith(prefix))) return '';
  return ` AND WorkflowId STARTS_WITH '${prefix}'`;
}

const RELEASED = `StasisResourceState = 'RELEASED' AND StasisStatus = 'WAITING' AND ExecutionStatus = 'Running'`;

/** Ids of `among` that are suspended with their compute RELEASED and waiting on an answer. */
export async function releasedAmong(env: BenchEnv, among: Set<string>): Promise<string[]> {
  const ids = await listIds(env, `${RELEASED}${phaseClause(among)}`);
  return [...ids].filter((id) => among.has(id));
}

/**
 * How many Runs of a phase are released and waiting: a count, so a poll sends no rows however many
 * Runs wait (listing them every 500 ms sent every waiting Run's search attributes and memo each time).
 * `among` must share a prefix no other phase uses (phaseClause); otherwise the Runs are listed.
 */
export async function countReleased(env: BenchEnv, among: Set<string>): Promise<number> {
  const clause = phaseClause(among);
  if (clause === '') return (await releasedAmong(env, among)).length;
  return (await env.temporal.workflow.count(`${RELEASED}${clause}`)).count;
}

/**
 * Polls (a count) until every id of `ids` is released or `by` passes; returns how many were then.
 * Never throws at `by`: a phase reports the Runs it reached.
 */
export async function waitReleased(env: BenchEnv, ids: Set<string>, by: number, intervalMs = 1000): Promise<number> {
  for (;;) {
    const released = await countReleased(env, ids);
    if (released >= ids.size || Date.now() > by) return released;
    await sleep(intervalMs);
  }
}

export interface Closed {
  completed: Set<string>;
  failed: Set<string>;
}

export async function closedAmong(env: BenchEnv, among: Set<string>): Promise<Closed> {
  const completed = await listIds(env, `ExecutionStatus = 'Completed'${phaseClause(among)}`);
  const failed = await listIds(
    env,
    `ExecutionStatus != 'Running' AND ExecutionStatus != 'Completed'${phaseClause(among)}`,
  );
  return {
    completed: new Set([...completed].filter((id) => among.has(id))),
    failed: new Set([...failed].filter((id) => among.has(id))),
  };
}

/** Polls until every id of `ids` is suspended and released; returns when that happened (ms since epoch) or throws at the deadline. */
export async function waitAllReleased(
  env: BenchEnv,
  ids: Set<string>,
  deadline: number,
  intervalMs = 250,
): Promise<void> {
  for (;;) {
    const released = await releasedAmong(env, ids);
    if (released.length === ids.size) return;
    if (Date.now() > deadline) throw new Error(`${released.length}/${ids.size} Runs released before the deadline`);
    await sleep(intervalMs);
  }
}

/** Polls until every id has closed, or the deadline passes; returns what had closed by then. */
export async function waitAllClosed(
  env: BenchEnv,
  ids: Set<string>,
  deadline: number,
  intervalMs = 250,
): Promise<Closed> {
  const clause = phaseClause(ids);
  for (;;) {
    // Polled by a count where the phase's Runs share a prefix (no rows sent), listed once at the end.
    if (clause !== '') {
      const { count } = await env.temporal.workflow.count(`ExecutionStatus != 'Running'${clause}`);
      if (count < ids.size && Date.now() <= deadline) {
        await sleep(intervalMs);
        continue;
      }
    }
    const closed = await closedAmong(env, ids);
    if (closed.completed.size + closed.failed.size === ids.size) return closed;
    if (Date.now() > deadline) return closed;
    await sleep(intervalMs);
  }
}

/** Answers `ids`, `concurrency` at a time; answers not sent by `deadline` are counted as one error, so a phase never overruns its budget. */
export async function respondAll(
  env: BenchEnv,
  ids: string[],
  concurrency: number,
  deadline = Infinity,
): Promise<string[]> {
  const errors: string[] = [];
  let unsent = 0;
  await mapLimit(ids, concurrency, async (id) => {
    if (Date.now() > deadline) {
      unsent += 1;
      return;
    }
    try {
      await env.client.runs.respond(id, 'int-1', { decision: 'approve' });
    } catch (err) {
      errors.push(`${id}: ${String(err)}`);
    }
  });
  if (unsent > 0) errors.push(`${unsent} of ${ids.length} answers not sent by the phase deadline`);
  return errors;
}

export interface Settled {
  completed: number;
  failed: number;
  /** Why Runs did not complete: each distinct reason with how many Runs it ended. */
  failures: Record<string, number>;
}

/** Waits for `ids` to close (or the deadline), then records why each Run that did not complete ended as it did. */
export async function settle(env: BenchEnv, ids: Set<string>, deadline: number, intervalMs: number): Promise<Settled> {
  const closed = await waitAllClosed(env, ids, deadline, intervalMs);
  const failures: Record<string, number> = {};
  const count = (reason: string) => (failures[reason] = (failures[reason] ?? 0) + 1);
  const open = ids.size - closed.completed.size - closed.failed.size;
  if (open > 0) failures['had not ended by the phase deadline'] = open;
  const examples = new Map<string, string>();
  await mapLimit([...closed.failed], 20, async (id) => {
    const reason = await failureOf(env, id);
    count(reason);
    if (!examples.has(reason)) examples.set(reason, id);
  });
  // One timeline per reason: how long the activity that timed out waited and ran.
  for (const [reason, id] of examples) {
    const timeline = lastTimeout(await timedHistory(env.temporal, id).catch(() => []));
    if (!timeline) continue;
    failures[`${reason} (e.g. ${timeline})`] = failures[reason];
    delete failures[reason];
  }
  return { completed: closed.completed.size, failed: closed.failed.size, failures };
}

/** The failure a closed Run ended with, without its Run id (so equal causes count together). */
async function failureOf(env: BenchEnv, id: string): Promise<string> {
  try {
    await env.temporal.workflow.getHandle(id).result();
    return 'closed without failure';
  } catch (err) {
    let cause: unknown = err instanceof WorkflowFailedError ? (err.cause ?? err) : err;
    const chain: string[] = [];
    while (cause instanceof Error && chain.length < 4) {
      chain.push(cause.message);
      cause = cause.cause;
    }
    return chain.join(' <- ').replaceAll(id, '<run>').slice(0, 300);
  }
}

/**
 * Answers each of `ids` once visibility shows it waiting (RELEASED and WAITING, polled every
 * `intervalMs`), `answer` 20 at a time, until all are answered or have ended, or the deadline.
 * Figure 2 drives the Stasis Runs and the bare-Temporal baseline with this same loop, so both are
 * answered on the same signal, with the same poll and visibility lag (bench/bare-workflow.ts
 * publishes the same two attributes when it waits).
 */
export async function answerWhenWaiting(
  env: BenchEnv,
  ids: string[],
  answer: (id: string) => Promise<unknown>,
  deadline: number,
  intervalMs = 200,
): Promise<string[]> {
  const idSet = new Set(ids);
  const answered = new Set<string>();
  const answering: Promise<string[]>[] = [];
  const answerAll = async (batch: string[]): Promise<string[]> => {
    const errors: string[] = [];
    await mapLimit(batch, 20, async (id) => {
      if (Date.now() > deadline) return errors.push(`${id}: answer not sent by the phase deadline`);
      await answer(id).catch((err: unknown) => errors.push(`${id}: ${String(err)}`));
    });
    return errors;
  };
  while (answered.size < ids.length && Date.now() < deadline) {
    const released = (await releasedAmong(env, idSet)).filter((id) => !answered.has(id));
    for (const id of released) answered.add(id);
    if (released.length > 0) answering.push(answerAll(released));
    // Runs that failed before suspending are never answered: stop waiting for them.
    const ended = await listIds(env, `ExecutionStatus != 'Running'${phaseClause(idSet)}`);
    for (const id of ids) if (ended.has(id) && !answered.has(id)) answered.add(id);
    if (answered.size < ids.length) await sleep(intervalMs);
  }
  return (await Promise.all(answering)).flat();
}
