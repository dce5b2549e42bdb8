import { spawn } from 'node:child_process';
import * as path from 'node:path';
import type { ActionView } from '../../common/schemas';
import { actUpdate } from '../../workflows/definitions';
import { CLI } from '../cli/spawn';
import { apiOnStack } from '../api/api-stack';
import { errorCode, errorMessage, type HttpResult } from '../api/http';
import { releasedView } from '../helpers/runs';
import { eventually, saw } from '../helpers/stack';

// The external driver: the agent is a program outside the worker that sends its
// Run one action at a time over REST (or the typed client). Real worker, real
// sandbox processes and files, real Temporal and MinIO.

const OPERATOR = { name: 'agent-1', secret: 'operator-secret-0123456789', role: 'operator' } as const;
const APPROVER = { name: 'alice', secret: 'approver-secret-0123456789', role: 'approver' } as const;

const api = apiOnStack([OPERATOR, APPROVER]);
const as = api.as;
const operator = as(OPERATOR);

async function startExternalRun(policy?: Record<string, unknown>): Promise<string> {
  const started = await operator('POST', '/api/v1/runs', {
    body: { agent: { driver: 'external' }, sandbox: { provider: 'local' }, ...(policy ? { policy } : {}) },
  });
  expect(started.status).toBe(201);
  return (started.json as { runId: string }).runId;
}

/** Sends an action over REST and, if it is still under way, polls it until it settles. */
async function act(runId: string, actionId: string, action: unknown): Promise<ActionView> {
  const sent = await operator('POST', `/api/v1/runs/${runId}/actions?waitMs=60000`, { body: { actionId, action } });
  expect({ status: sent.status, json: sent.status >= 400 ? sent.json : undefined }).toEqual({
    status: expect.any(Number),
    json: undefined,
  });
  return settled(runId, actionId);
}

async function settled(runId: string, actionId: string): Promise<ActionView> {
  return eventually(
    async () => {
      const view = saw((await operator('GET', `/api/v1/runs/${runId}/actions/${actionId}`)).json as ActionView);
      return view.status === 'succeeded' || view.status === 'failed' ? view : undefined;
    },
    120_000,
    `action ${actionId} settled`,
  );
}

/** Sends an action expected to be refused: its status, code and message. */
async function refusal(runId: string, actionId: string, action: unknown) {
  const response = await operator('POST', `/api/v1/runs/${runId}/actions`, { body: { actionId, action } });
  return { status: response.status, code: errorCode(response), message: errorMessage(response) };
}

const resultOf = (view: ActionView) => {
  expect(view).toMatchObject({ status: 'succeeded' });
  return view.result as Record<string, unknown>;
};

test('an external agent drives a Run to completion over REST, across a worker restart between two actions', async () => {
  const runId = await startExternalRun();
  expect(resultOf(await act(runId, 'a1', { type: 'writeFile', path: 'notes/plan.txt', content: 'plan\n' }))).toEqual({
    path: 'notes/plan.txt',
    written: true,
  });
  expect(
    resultOf(await act(runId, 'a2', { type: 'exec', command: 'cat notes/plan.txt; echo oops >&2; exit 3' })),
  ).toEqual({ exitCode: 3, stdout: 'plan\n', stderr: 'oops\n' });

  // The agent thinks while the worker goes away and a new one takes over.
  await api.stack.stopWorker('host-a');
  await api.stack.startWorker('host-a');

  expect(resultOf(await act(runId, 'a3', { type: 'exec', command: 'echo more >> notes/plan.txt' }))).toMatchObject({
    exitCode: 0,
  });
  expect(resultOf(await act(runId, 'a4', { type: 'readFile', path: 'notes/plan.txt' }))).toEqual({
    path: 'notes/plan.txt',
    content: 'plan\nmore\n',
  });
  expect(resultOf(await act(runId, 'a5', { type: 'complete', output: { done: true } }))).toEqual({
    output: { done: true },
  });
  expect(await api.stack.temporal.workflow.getHandle(runId).result()).toEqual({ done: true });
  expect(await api.stack.client.runs.get(runId)).toMatchObject({ status: 'COMPLETED', output: { done: true } });

  // A retried complete still gets its outcome; a new action on the ended Run is a clear 409.
  const again = await operator('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'a5', action: { type: 'complete', output: { done: true } } },
  });
  expect(again.status).toBe(200);
  expect(again.json).toMatchObject({ actionId: 'a5', status: 'succeeded', result: { output: { done: true } } });
  expect(await refusal(runId, 'a6', { type: 'exec', command: 'true' })).toEqual({
    status: 409,
    code: 'INVALID_STATE_TRANSITION',
    message: expect.stringContaining('COMPLETED'),
  });
}, 300_000);

test('a retried action with the same actionId runs once; another body under it is 409; one action at a time', async () => {
  const runId = await startExternalRun();
  const append = { type: 'exec', command: 'echo ran >> count.txt; sleep 2' } as const;
  // The same request three times at once, and once more after it finished.
  const sends = await Promise.all(
    [1, 2, 3].map(() =>
      operator('POST', `/api/v1/runs/${runId}/actions?waitMs=0`, { body: { actionId: 'count-1', action: append } }),
    ),
  );
  for (const sent of sends) expect([200, 202]).toContain(sent.status);
  const busy = await operator('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'other', action: { type: 'exec', command: 'echo ran >> count.txt' } },
  });
  // Unless the first one already finished, a second action is refused while it runs.
  if (busy.status !== 200) {
    expect({ status: busy.status, code: errorCode(busy), message: errorMessage(busy) }).toEqual({
      status: 409,
      code: 'INVALID_STATE_TRANSITION',
      message: expect.stringContaining('count-1 is still under way'),
    });
  }
  const first = await settled(runId, 'count-1');
  const retried = await operator('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'count-1', action: append },
  });
  expect(retried.status).toBe(200);
  expect(retried.json).toEqual(first);
  // Through the typed client too.
  expect(await api.stack.client.runs.act(runId, { actionId: 'count-1', action: append })).toEqual(first);

  const conflict = await operator('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'count-1', action: { type: 'exec', command: 'echo ran >> count.txt; echo again' } },
  });
  expect({ status: conflict.status, code: errorCode(conflict) }).toEqual({ status: 409, code: 'IDEMPOTENCY_CONFLICT' });

  const counted = resultOf(await act(runId, 'count-2', { type: 'exec', command: 'cat count.txt' }));
  // 'other' ran only if it was admitted (the first action had finished by then).
  expect(counted.stdout).toBe(busy.status === 200 ? 'ran\nran\n' : 'ran\n');
  await act(runId, 'end', { type: 'complete' });
}, 300_000);

test('an ask suspends and releases the sandbox; the answer resumes it and is the result the agent gets', async () => {
  const runId = await startExternalRun();
  await act(runId, 'w', { type: 'writeFile', path: 'kept.txt', content: 'before the question\n' });
  const ask = {
    type: 'ask',
    ask: 'Deploy to production?',
    title: 'Deploy',
    details: '**Release 1.2**',
    action: { command: 'make deploy', files: ['Makefile'] },
    accepts: ['approve', 'deny', 'edit'],
  };
  const sent = await operator('POST', `/api/v1/runs/${runId}/actions`, { body: { actionId: 'q1', action: ask } });
  expect(sent.status).toBe(202);
  expect(sent.json).toMatchObject({ actionId: 'q1', type: 'ask', status: 'waiting', interactionId: 'int-1' });
  const view = await releasedView(api.stack.client, runId, 120_000);
  expect(view.suspension).toMatchObject({ reason: 'INTERACTION', interactionIds: ['int-1'] });
  const provider = api.stack.workers.get('host-a')!.registry.get('local');
  expect(await provider.processCount(view.record.sandboxId)).toBe(0);
  expect(await api.stack.client.runs.get(runId)).toMatchObject({
    status: 'WAITING',
    interactions: [expect.objectContaining({ id: 'int-1', status: 'pending', prompt: 'Deploy to production?' })],
  });
  // Still waiting for a person: polling says so, and no other action is taken meanwhile.
  expect((await operator('GET', `/api/v1/runs/${runId}/actions/q1`)).json).toMatchObject({ status: 'waiting' });
  const meanwhile = await operator('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'x', action: { type: 'exec', command: 'true' } },
  });
  expect({ status: meanwhile.status, code: errorCode(meanwhile) }).toEqual({
    status: 409,
    code: 'INVALID_STATE_TRANSITION',
  });

  const answered = await as(APPROVER)('POST', `/api/v1/runs/${runId}/interactions/int-1`, {
    body: { decision: 'approve', comment: 'go' },
  });
  expect(answered.status).toBe(200);
  expect(resultOf(await settled(runId, 'q1'))).toEqual({
    interactionId: 'int-1',
    decision: 'approve',
    comment: 'go',
    respondedBy: 'alice',
  });
  // The sandbox came back with its workspace.
  expect(resultOf(await act(runId, 'r', { type: 'exec', command: 'cat kept.txt' }))).toMatchObject({
    stdout: 'before the question\n',
  });
  expect((await api.stack.client.runs.resource(runId)).record.state).toBe('ACTIVE');
  await act(runId, 'end', { type: 'fail', code: 'AGENT_GAVE_UP', message: 'enough' });
  expect(await api.stack.client.runs.get(runId)).toMatchObject({
    status: 'FAILED',
    error: { code: 'AGENT_GAVE_UP', message: 'enough' },
  });
}, 300_000);

test("a failed action is the agent's to handle: it fails, the Run goes on (a planted symlink, a timeout, a child)", async () => {
  const runId = await startExternalRun();
  expect(resultOf(await act(runId, 'read', { type: 'readFile', path: 'nothing-here.txt' }))).toEqual({
    path: 'nothing-here.txt',
  });
  // The sandbox plants a symlink to a host file: reading it through the Run is refused, never followed.
  await act(runId, 'plant', { type: 'exec', command: 'ln -s /etc/passwd link.txt' });
  const followed = await act(runId, 'follow', { type: 'readFile', path: 'link.txt' });
  expect(followed).toMatchObject({
    status: 'failed',
    error: { code: 'INVALID_ARGUMENT', message: expect.stringContaining('symlink') },
  });
  expect(followed).not.toHaveProperty('result');
  const timedOut = resultOf(await act(runId, 'slow', { type: 'exec', command: 'sleep 30', timeoutMs: 500 }));
  expect(timedOut).toMatchObject({ exitCode: 124, stderr: expect.stringContaining('timed out after 500 ms') });
  const spawned = resultOf(
    await act(runId, 'child', {
      type: 'spawn',
      spec: { agent: { driver: 'scripted', steps: [{ complete: 'child done' }] }, sandbox: { provider: 'local' } },
    }),
  );
  expect(spawned).toEqual({ runId: `${runId}.child-1` });
  expect(await api.stack.temporal.workflow.getHandle(`${runId}.child-1`).result()).toBe('child done');
  await act(runId, 'end', { type: 'complete', output: 'parent done' });
  expect(await api.stack.temporal.workflow.getHandle(runId).result()).toBe('parent done');
}, 300_000);

test('a readFile within the 1 MiB file limit reads, or fails at once with PAYLOAD_TOO_LARGE naming the limit on its JSON size', async () => {
  const runId = await startExternalRun();
  // 400,000 bytes of U+0001: valid UTF-8 under the 1 MiB file limit, but 2.4 MB as JSON text (\u0001 each).
  const made = await act(runId, 'mk', {
    type: 'exec',
    command: "head -c 400000 /dev/zero | tr '\\000' '\\001' > ctl.dat && wc -c < ctl.dat",
  });
  expect(resultOf(made)).toMatchObject({ exitCode: 0, stdout: '400000\n' });
  const started = Date.now();
  const controls = await act(runId, 'rd-ctl', { type: 'readFile', path: 'ctl.dat' });
  expect({ ...controls, tookMs: Date.now() - started }).toMatchObject({
    status: 'failed',
    error: {
      code: 'PAYLOAD_TOO_LARGE',
      message: expect.stringMatching(/ctl\.dat.*400000 bytes are 2400002 bytes as JSON text.*more than the 1572864/),
    },
    tookMs: expect.any(Number),
  });
  // At once: refused before anything is sent, not retried for minutes.
  expect(Date.now() - started).toBeLessThan(15_000);
  // Ordinary text of the whole 1 MiB, each line with quotes and a line break to escape, reads whole.
  const line = 'a "quoted" line of text\n';
  const text = line.repeat(Math.ceil((1024 * 1024) / line.length)).slice(0, 1024 * 1024);
  const written = await act(runId, 'mk-text', {
    type: 'exec',
    command: `yes 'a "quoted" line of text' | head -c ${1024 * 1024} > big.txt`,
  });
  expect(resultOf(written)).toMatchObject({ exitCode: 0 });
  const read = resultOf(await act(runId, 'rd-text', { type: 'readFile', path: 'big.txt' }));
  expect({ length: (read.content as string).length, same: read.content === text }).toEqual({
    length: text.length,
    same: true,
  });
  // The Run goes on: the agent decides.
  expect(resultOf(await act(runId, 'after', { type: 'exec', command: 'echo on' }))).toMatchObject({ stdout: 'on\n' });
  await operator('POST', `/api/v1/runs/${runId}/cancel`);
}, 300_000);

test('a Run whose workflow was terminated in Temporal reads FAILED; its ask reads failed with the reason; answers and actions are 409', async () => {
  const runId = await startExternalRun();
  const sent = await operator('POST', `/api/v1/runs/${runId}/actions?waitMs=0`, {
    body: { actionId: 'q', action: { type: 'ask', ask: 'ok?' } },
  });
  expect(sent.status).toBeLessThan(300);
  const interactionId = await eventually(
    async () => saw((await operator('GET', `/api/v1/runs/${runId}/actions/q`)).json as ActionView).interactionId,
    60_000,
    'ask opens',
  );
  await api.stack.temporal.workflow.getHandle(runId).terminate('operator pulled the plug');
  const approver = as(APPROVER);
  const reason = expect.stringContaining('terminated in Temporal');
  const got = await approver('GET', `/api/v1/runs/${runId}`);
  expect(got.json).toMatchObject({
    status: 'FAILED',
    error: { code: 'RUN_FAILED', message: expect.stringContaining('operator pulled the plug') },
    interactions: [{ id: interactionId, status: 'cancelled' }],
  });
  // The agent polling its ask learns it failed, with the Run's reason.
  const view = (await operator('GET', `/api/v1/runs/${runId}/actions/q`)).json as ActionView;
  expect(view).toMatchObject({ status: 'failed', interactionId, error: { code: 'RUN_FAILED', message: reason } });
  // Sent again, the same ask is its outcome; a new action or an answer is 409 naming the state, never 404.
  const again = await operator('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'q', action: { type: 'ask', ask: 'ok?' } },
  });
  expect({ status: again.status, view: again.json }).toMatchObject({ status: 200, view: { status: 'failed' } });
  const refusedBody = (r: HttpResult) => ({ status: r.status, code: errorCode(r), message: errorMessage(r) });
  const answer = await approver('POST', `/api/v1/runs/${runId}/interactions/${interactionId}`, {
    body: { decision: 'approve' },
  });
  expect(refusedBody(answer)).toEqual({
    status: 409,
    code: 'INVALID_STATE_TRANSITION',
    message: `run ${runId} is FAILED`,
  });
  expect(await refusal(runId, 'next', { type: 'exec', command: 'true' })).toEqual({
    status: 409,
    code: 'INVALID_STATE_TRANSITION',
    message: `run ${runId} is FAILED`,
  });
  expect(refusedBody(await operator('POST', `/api/v1/runs/${runId}/cancel`))).toMatchObject({ status: 409 });
  // Nothing lists it as waiting: not the pending interactions (the page's list), not the Run list.
  const pending = (await approver('GET', '/api/v1/interactions')).json as { interactions: { runId: string }[] };
  expect(pending.interactions.filter((p) => p.runId === runId)).toEqual([]);
  const waiting = (await approver('GET', '/api/v1/runs?status=WAITING')).json as { runs: { runId: string }[] };
  expect(waiting.runs.filter((r) => r.runId === runId)).toEqual([]);
  const all = (await approver('GET', '/api/v1/runs?limit=1000')).json as { runs: { runId: string; status: string }[] };
  expect(all.runs.filter((r) => r.runId === runId)).toEqual([expect.objectContaining({ status: 'FAILED' })]);
  // Listed as FAILED when asked for FAILED Runs too, though visibility last heard WAITING from it.
  const failed = (await approver('GET', '/api/v1/runs?status=FAILED&limit=1000')).json as { runs: { runId: string }[] };
  expect(failed.runs.filter((r) => r.runId === runId)).toEqual([expect.objectContaining({ status: 'FAILED' })]);
}, 300_000);

test('bad action bodies are 400 naming the field, and change nothing', async () => {
  const runId = await startExternalRun();
  const bad: [unknown, string][] = [
    [{ action: { type: 'exec', command: 'true' } }, 'body.actionId'],
    [{ actionId: 'has space', action: { type: 'exec', command: 'true' } }, 'body.actionId'],
    [{ actionId: 'b', action: { type: 'rm -rf' } }, 'body.action.type'],
    [{ actionId: 'b', action: { type: 'exec' } }, 'body.action.command'],
    [{ actionId: 'b', action: { type: 'exec', command: 'true', background: true } }, 'body.action'],
    [{ actionId: 'b', action: { type: 'writeFile', path: '../escape', content: 'x' } }, 'body.action.path'],
    [{ actionId: 'b', action: { type: 'readFile', path: '/etc/passwd' } }, 'body.action.path'],
    [{ actionId: 'b', action: { type: 'ask', ask: 'q', accepts: ['option'] } }, 'body.action.accepts'],
    [{ actionId: 'b', action: { type: 'ask', ask: 'q', kind: 'input', accepts: ['edit'] } }, 'body.action.accepts'],
    [{ actionId: 'b', action: { type: 'ask', ask: 'q', options: ['a', 'a'] } }, 'body.action.options'],
    [{ actionId: 'b', action: { type: 'ask', ask: 'q', title: 'x'.repeat(201) } }, 'body.action.title'],
    [{ actionId: 'b', action: { type: 'spawn', spec: { agent: { driver: 'external' } } } }, 'body.action.spec.sandbox'],
    [{ actionId: 'b', action: { type: 'exec', command: 'true', timeoutMs: -1 } }, 'body.action.timeoutMs'],
    [{ actionId: 'b', action: { type: 'exec', command: 'true' }, extra: 1 }, 'body'],
  ];
  for (const [body, field] of bad) {
    const response = await operator('POST', `/api/v1/runs/${runId}/actions`, { body });
    expect({ body, status: response.status, code: errorCode(response), message: errorMessage(response) }).toEqual({
      body,
      status: 400,
      code: 'INVALID_ARGUMENT',
      message: expect.stringContaining(field),
    });
  }
  const wait = await operator('POST', `/api/v1/runs/${runId}/actions?waitMs=99999999`, {
    body: { actionId: 'b', action: { type: 'exec', command: 'true' } },
  });
  expect({ status: wait.status, message: errorMessage(wait) }).toEqual({
    status: 400,
    message: expect.stringContaining('query.waitMs'),
  });
  expect(errorCode(await operator('GET', `/api/v1/runs/${runId}/actions/b`))).toBe('NOT_FOUND');

  // The workflow's own check refuses what a client talking to Temporal directly might send.
  const handle = api.stack.temporal.workflow.getHandle(runId);
  const direct: [unknown, string][] = [
    [{ actionId: 'd', action: { type: 'exec', command: '' } }, 'action.command'],
    [{ actionId: 'd', action: { type: 'ask', ask: 'q', accepts: ['option'] } }, 'action.accepts'],
    [{ actionId: 'd', action: { type: 'exec', command: 'true', shell: '/bin/bash' } }, 'action.shell'],
    [{ actionId: '../d', action: { type: 'complete' } }, 'actionId'],
    ['junk', '(root)'],
  ];
  for (const [input, field] of direct) {
    await expect(handle.executeUpdate(actUpdate, { args: [input as never] })).rejects.toMatchObject({
      cause: { type: 'INVALID_ARGUMENT', message: expect.stringContaining(field) },
    });
  }
  expect(await api.stack.client.runs.get(runId)).toMatchObject({ status: 'RUNNING', interactions: [] });
  // The Run still takes a good action.
  expect(resultOf(await act(runId, 'good', { type: 'exec', command: 'echo fine' }))).toMatchObject({
    stdout: 'fine\n',
  });
  await act(runId, 'end', { type: 'complete' });
}, 300_000);

test('a Run whose agent is not external takes no actions (409), an unknown Run is 404', async () => {
  const { runId } = await api.stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ ask: 'hold on' }] },
    sandbox: { provider: 'local' },
  });
  await eventually(async () => saw(await api.stack.client.runs.get(runId)).status === 'WAITING', 60_000, 'waiting');
  expect(await refusal(runId, 'a', { type: 'complete' })).toEqual({
    status: 409,
    code: 'INVALID_STATE_TRANSITION',
    message: expect.stringContaining('not the external driver'),
  });
  const unknown = await operator('POST', '/api/v1/runs/no-such-run/actions', {
    body: { actionId: 'a', action: { type: 'complete' } },
  });
  expect({ status: unknown.status, code: errorCode(unknown) }).toEqual({ status: 404, code: 'NOT_FOUND' });
  // An approver answers questions; it does not drive agents.
  expect(
    (
      await as(APPROVER)('POST', `/api/v1/runs/${runId}/actions`, {
        body: { actionId: 'a', action: { type: 'complete' } },
      })
    ).status,
  ).toBe(403);
  await api.stack.client.runs.cancel(runId);
}, 120_000);

test('examples/external-agent drives its Run to completion over REST, with a person approving its ask', async () => {
  const agent = spawn(
    CLI.command,
    ['-r', path.join(CLI.cwd, 'scripts', 'register-ts.js'), 'examples/external-agent/agent.ts'],
    {
      cwd: CLI.cwd,
      env: { ...process.env, STASIS_API_URL: api.base(), STASIS_API_TOKEN: OPERATOR.secret },
    },
  );
  let output = '';
  agent.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  agent.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  const exited = new Promise<number | null>((resolve) => agent.once('close', resolve));
  try {
    const runId = await eventually(async () => /run (run-\S+)/.exec(output)?.[1], 60_000, 'the agent started its Run');
    await eventually(
      async () => saw(await api.stack.client.runs.get(runId)).status === 'WAITING',
      120_000,
      'the agent asks',
    );
    const [question] = (await api.stack.client.runs.get(runId)).interactions;
    expect(question).toMatchObject({ id: 'int-1', status: 'pending', prompt: 'Publish the greeting?' });
    await api.stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { respondedBy: 'alice' });
    expect({ code: await exited, output }).toEqual({
      code: 0,
      output: expect.stringContaining(`run ${runId} COMPLETED`),
    });
    const done = await api.stack.client.runs.get(runId);
    expect(done).toMatchObject({
      status: 'COMPLETED',
      output: { greeting: expect.stringMatching(/^hello from \S+\n$/) },
    });
  } finally {
    agent.kill('SIGKILL');
  }
}, 300_000);

test('a Run suspended by hand takes no action until resumed; an action under way when the Run is cancelled reads failed', async () => {
  const runId = await startExternalRun();
  await act(runId, 'before', { type: 'writeFile', path: 'a.txt', content: 'kept' });
  expect((await operator('POST', `/api/v1/runs/${runId}/suspend`)).status).toBe(200);
  expect(await refusal(runId, 'during', { type: 'readFile', path: 'a.txt' })).toEqual({
    status: 409,
    code: 'INVALID_STATE_TRANSITION',
    message: expect.stringContaining('not waiting for an action'),
  });
  expect((await operator('POST', `/api/v1/runs/${runId}/resume`)).status).toBe(200);
  expect(resultOf(await act(runId, 'during', { type: 'readFile', path: 'a.txt' }))).toEqual({
    path: 'a.txt',
    content: 'kept',
  });

  const slow = await operator('POST', `/api/v1/runs/${runId}/actions?waitMs=0`, {
    body: { actionId: 'slow', action: { type: 'exec', command: 'sleep 600' } },
  });
  expect(slow.status).toBe(202);
  expect(slow.json).toMatchObject({ actionId: 'slow', status: 'running' });
  expect((await operator('POST', `/api/v1/runs/${runId}/cancel`)).status).toBe(200);
  const ended = await settled(runId, 'slow');
  expect(ended).toMatchObject({ status: 'failed', error: { message: expect.stringContaining('CANCELLED') } });
  expect(await api.stack.client.runs.get(runId)).toMatchObject({ status: 'CANCELLED' });
}, 300_000);

// The Run kept action results "within 512 KiB" counting UTF-16 code units: two readFile results of
// 256,000 "€" (768 KB of UTF-8 each, as Temporal counts them) were both kept, and with a spec of 600 KB
// continue-as-new's input was over Temporal's limit: Temporal terminated the Run (found by an attack
// review). Results are counted in UTF-8 bytes, and continue-as-new's whole input is kept within bound.
test('the Run keeps action results within 512 KiB of UTF-8 and survives continue-as-new with non-ASCII file contents', async () => {
  const started = await operator('POST', '/api/v1/runs', {
    body: { agent: { driver: 'external' }, sandbox: { provider: 'local' }, labels: { note: 'n'.repeat(600_000) } },
  });
  expect(started.status).toBe(201);
  const runId = (started.json as { runId: string }).runId;
  const handle = api.stack.temporal.workflow.getHandle(runId);
  const first = (await handle.describe()).runId;
  const text = '€'.repeat(256_000);
  expect((await act(runId, 'w1', { type: 'writeFile', path: 'a.txt', content: text })).status).toBe('succeeded');
  expect((await act(runId, 'w2', { type: 'writeFile', path: 'b.txt', content: text })).status).toBe('succeeded');
  const utf8 = (v: unknown) => Buffer.byteLength(JSON.stringify(v), 'utf8');
  let worstKeptBytes = 0;
  for (let round = 1; round <= 6; round++) {
    const a = await act(runId, `ra-${round}`, { type: 'readFile', path: 'a.txt' });
    const b = await act(runId, `rb-${round}`, { type: 'readFile', path: 'b.txt' });
    expect({ round, a: a.status, b: b.status, content: (b.result as { content?: string }).content === text }).toEqual({
      round,
      a: 'succeeded',
      b: 'succeeded',
      content: true,
    });
    await act(runId, `x-${round}`, { type: 'exec', command: 'true' });
    const views = await Promise.all(
      [a, b].map(
        async (v) => (await operator('GET', `/api/v1/runs/${runId}/actions/${v.actionId}`)).json as ActionView,
      ),
    );
    worstKeptBytes = Math.max(
      worstKeptBytes,
      views.filter((v) => v.result !== undefined).reduce((sum, v) => sum + utf8(v.result), 0),
    );
    expect(views.every((v) => v.result !== undefined || v.resultForgotten)).toBe(true);
    expect({ round, wf: (await handle.describe()).status.name }).toEqual({ round, wf: 'RUNNING' });
  }
  expect(worstKeptBytes).toBeLessThanOrEqual(512 * 1024);
  // It did continue as new (the test stack suggests it early), and completes.
  expect((await handle.describe()).runId).not.toBe(first);
  expect(resultOf(await act(runId, 'done', { type: 'complete', output: 1 }))).toEqual({ output: 1 });
  await eventually(
    async () => ((await handle.describe()).status.name === 'COMPLETED' ? true : undefined),
    60_000,
    'the Run to complete',
  );
}, 900_000);
