import type { BenchEnv } from './env';
import { mapLimit, sleep } from './stats';

// Many Runs at once, watched through Temporal visibility (one list call per
// poll for the whole fleet, instead of one query per Run).

export async function listIds(env: BenchEnv, query: string): Promise<Set<string>> {
  const ids = new Set<string>();
  for await (const wf of env.temporal.workflow.list({ query, pageSize: 1000 })) ids.add(wf.workflowId);
  return ids;
}

/** Ids of `among` that are suspended with their compute RELEASED and waiting on an answer. */
export async function releasedAmong(env: BenchEnv, among: Set<string>): Promise<string[]> {
  const ids = await listIds(env, `StasisResourceState = 'RELEASED' AND StasisStatus = 'WAITING' AND ExecutionStatus = 'Running'`);
  return [...ids].filter((id) => among.has(id));
}

export interface Closed {
  completed: Set<string>;
  failed: Set<string>;
}

export async function closedAmong(env: BenchEnv, among: Set<string>): Promise<Closed> {
  const completed = await listIds(env, `ExecutionStatus = 'Completed'`);
  const failed = await listIds(env, `ExecutionStatus != 'Running' AND ExecutionStatus != 'Completed'`);
  return {
    completed: new Set([...completed].filter((id) => among.has(id))),
    failed: new Set([...failed].filter((id) => among.has(id))),
  };
}

/** Polls until every id of `ids` is suspended and released; returns when that happened (ms since epoch) or throws at the deadline. */
export async function waitAllReleased(env: BenchEnv, ids: Set<string>, deadline: number, intervalMs = 250): Promise<void> {
  for (;;) {
    const released = await releasedAmong(env, ids);
    if (released.length === ids.size) return;
    if (Date.now() > deadline) throw new Error(`${released.length}/${ids.size} Runs released before the deadline`);
    await sleep(intervalMs);
  }
}

/** Polls until every id has closed, or the deadline passes; returns what had closed by then. */
export async function waitAllClosed(env: BenchEnv, ids: Set<string>, deadline: number, intervalMs = 250): Promise<Closed> {
  for (;;) {
    const closed = await closedAmong(env, ids);
    if (closed.completed.size + closed.failed.size === ids.size) return closed;
    if (Date.now() > deadline) return closed;
    await sleep(intervalMs);
  }
}

export async function respondAll(env: BenchEnv, ids: string[], concurrency: number): Promise<string[]> {
  const errors: string[] = [];
  await mapLimit(ids, concurrency, async (id) => {
    try {
      await env.client.runs.respond(id, 'int-1', { decision: 'approve' });
    } catch (err) {
      errors.push(`${id}: ${String(err)}`);
    }
  });
  return errors;
}
