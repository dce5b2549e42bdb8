import type { AgentAction, AgentDriver } from '../../drivers/api';
import { CARRIED_INTERACTIONS } from '../../workflows/run-state';
import { useStack, startStackOnOwnTemporal } from '../helpers/stack';

// A long Run — thousands of steps, outputs of several MiB, hundreds of interactions —
// completes, with bounded history per workflow run and bounded state carried through
// continue-as-new. `STASIS_SCALE=1` runs the full size (5,000 steps, 500 interactions).
// A full-size run (2 cores shared with other test runs, load 15-18) took 1,910 s over 374
// workflow runs of at most 229 events and 0.9 MB of history (as JSON) each, carrying at most 32 KB
// into each continue-as-new; the test prints these figures at its end.
const FULL = process.env.STASIS_SCALE === '1';
const STEPS = FULL ? 5_000 : 100;
const ASK_EVERY = 10;
const BIG_AT = new Set(FULL ? [100, 1_000, 2_500, 4_000, 4_900] : [20, 50, 80]);

/** Writes a small file each step, prints 1 MiB to stdout and 1 MiB to stderr at BIG_AT, asks every ASK_EVERY steps. */
const long: AgentDriver = {
  name: 'long',
  async step({ state, lastResult }) {
    const s = (state as { i: number; truncated: number } | undefined) ?? { i: 0, truncated: 0 };
    const out = (lastResult as { stdout?: string } | undefined)?.stdout ?? '';
    const truncated = s.truncated + (out.startsWith('[stasis: output truncated') && out.endsWith('a') ? 1 : 0);
    const next = { i: s.i + 1, truncated };
    let action: AgentAction;
    if (s.i >= STEPS) action = { type: 'complete', output: { steps: s.i, truncated } };
    else if (BIG_AT.has(s.i)) {
      const command = "head -c 1048576 /dev/zero | tr '\\0' a; head -c 1048576 /dev/zero | tr '\\0' b >&2";
      action = { type: 'job', command, pauseBehavior: 'CANCEL', executionAffinity: 'SANDBOX', background: false };
    } else if (s.i % ASK_EVERY === ASK_EVERY - 1)
      action = { type: 'interaction', kind: 'approval', prompt: `step ${s.i}?` };
    else action = { type: 'writeFile', path: 'step.txt', content: String(s.i) };
    return { action, state: next };
  },
};

const stack = useStack(() => startStackOnOwnTemporal(200, { worker: { drivers: [long] } }));

test(`a Run of ${STEPS} steps, ${BIG_AT.size} outputs of 2 MiB and ${STEPS / ASK_EVERY} interactions completes with bounded history and carried state`, async () => {
  const started = Date.now();
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'long' },
    sandbox: { provider: 'local', workspace: { kind: 'isolated' } },
    policy: { pauseMode: 'DETACH' },
  });
  const handle = stack.temporal.workflow.getHandle(runId);
  let answered = 0;
  let done = false;
  const result = handle.result().finally(() => (done = true));
  while (!done) {
    const pending = (await stack.client.runs.get(runId)).interactions.filter((i) => i.status === 'pending');
    for (const i of pending) {
      await stack.client.runs.respond(runId, i.id, { decision: 'approve' });
      answered += 1;
    }
    if (pending.length === 0) await new Promise((r) => setTimeout(r, 100));
  }
  await expect(result).resolves.toEqual({ steps: STEPS, truncated: BIG_AT.size });
  expect(answered).toBe(STEPS / ASK_EVERY);

  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.interactions.length).toBeLessThanOrEqual(CARRIED_INTERACTIONS + STEPS / ASK_EVERY / 2);
  expect(snapshot.interactions.at(-1)?.id).toBe(`int-${STEPS / ASK_EVERY}`);
  let runs = 0;
  const most = { events: 0, historyBytes: 0, carriedBytes: 0 };
  for await (const wf of stack.temporal.workflow.list({ query: `WorkflowId = '${runId}'` })) {
    runs += 1;
    const events = (await stack.temporal.workflow.getHandle(runId, wf.runId).fetchHistory()).events ?? [];
    const bytes = events.reduce((n, e) => n + JSON.stringify(e).length, 0);
    // Bounded whatever the Run's length: the server suggests continue-as-new at 200 events.
    expect(events.length).toBeLessThan(1_000);
    expect(bytes).toBeLessThan(16 * 1024 * 1024);
    const input = events[0].workflowExecutionStartedEventAttributes?.input?.payloads?.[0]?.data;
    // Carried state: the newest settled interactions, running jobs only, a bounded last result.
    expect(input?.length ?? 0).toBeLessThan(1024 * 1024);
    most.events = Math.max(most.events, events.length);
    most.historyBytes = Math.max(most.historyBytes, bytes);
    most.carriedBytes = Math.max(most.carriedBytes, input?.length ?? 0);
  }
  expect(runs).toBeGreaterThan(1);
  // The figures behind the claim, for the record (the comment at the top quotes a full-size run).
  console.info(
    `bounded state: ${STEPS} steps in ${runs} workflow runs, ${(Date.now() - started) / 1000} s; at most ${JSON.stringify(most)}`,
  );
}, 3_600_000);
