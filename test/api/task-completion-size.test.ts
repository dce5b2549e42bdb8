import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PENDING_MEMO } from '../../common/interactions';
import { jsonBytes } from '../../common/payload-limits';
import type { ActionView, InteractionRequest } from '../../common/schemas';
import type { WebhookPayload } from '../../common/webhooks';
import { PATCH_RUN_BASELINE_4 } from '../../workflows/run-controller';
import { INTERACTION_PAYLOAD_MAX_BYTES, PENDING_MEMO_MAX_BYTES } from '../../workflows/run-state';
import { patchIdsOfEveryExecution } from '../helpers/patches';
import { eventually, saw, workerLogs } from '../helpers/stack';
import { apiOnStack } from './api-stack';

// One workflow task's completion is one gRPC message, at most 4 MiB. Found by an attack review: an
// external agent's ask, each part within its limit, made one larger, and the agent's action came back
// as a bare 500 "Workflow Update failed" (the task failed on each try, the Run lived on without it).
// The ask's task held three large things: the act Update's input (the ask, up to the 1 MiB input
// limit), the memo of pending interactions (the ask again, whole, with the Run's labels: up to 2 MB)
// and the webhook delivery's input (the same again, up to 1.5 MiB). The memo now lists pending
// interactions within PENDING_MEMO_MAX_BYTES (fitPendingMemo); the snapshot serves them whole. An
// answer's task held the same kind of three: the respond Update's input (up to 1 MiB), its result and
// the delivery (up to 1.5 MiB each, now INTERACTION_PAYLOAD_MAX_BYTES, 1 MiB).
// (Without a webhook configured, a Run that has continued as new starts deliveries too: it no longer
// knows its worker has none. That is how the review met it: labels of 950 KB, then asks.)

const AGENT = { name: 'bot', secret: 'agent-secret-0123456789', role: 'agent' } as const;
const APPROVER = { name: 'alice', secret: 'approver-secret-0123456789', role: 'approver' } as const;

/** gRPC's default limit on one message, which Temporal's frontend keeps. */
const GRPC_MESSAGE_LIMIT = 4 * 1024 * 1024;
const INPUT_LIMIT = 1024 * 1024;
/** The bound a respond result and a delivery's input had before (1.5 MiB): the sizes below fill it. */
const OLD_PAYLOAD_BOUND = 1536 * 1024;

let receiver: Server;
const received: WebhookPayload[] = [];
beforeAll(async () => {
  receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      received.push(JSON.parse(Buffer.concat(chunks).toString('utf8')) as WebhookPayload);
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
});
afterAll(async () => {
  receiver.closeAllConnections();
  await new Promise<void>((resolve) => receiver.close(() => resolve()));
});

const api = apiOnStack([AGENT, APPROVER], () => ({
  env: { STASIS_WEBHOOK_URL: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook` },
}));
const agent = api.as(AGENT);
const approver = api.as(APPROVER);

/** The action's view once `test` holds for it. */
async function actionOnceIt(runId: string, actionId: string, test: (v: ActionView) => unknown): Promise<ActionView> {
  return eventually(
    async () => {
      const view = saw((await agent('GET', `/api/v1/runs/${runId}/actions/${actionId}`)).json as ActionView);
      expect(view.status).not.toBe('failed');
      return test(view) ? view : undefined;
    },
    60_000,
    `${actionId} to move on`,
  );
}

/** The webhook delivery of `event` for `interactionId`, once the receiver has it. */
function delivery(runId: string, event: string, interactionId: string): Promise<WebhookPayload> {
  return eventually(
    async () => received.find((p) => p.runId === runId && p.event === event && p.interaction?.id === interactionId),
    60_000,
    `the ${event} delivery`,
  );
}

/** Answers `interactionId` (once the Run takes answers for it) with an approval. */
async function approve(runId: string, interactionId: string): Promise<InteractionRequest> {
  const answered = await eventually(
    async () => {
      const got = await approver('POST', `/api/v1/runs/${runId}/interactions/${interactionId}`, {
        body: { decision: 'approve' },
      });
      expect(got.status).not.toBeGreaterThanOrEqual(500);
      return got.status === 200 ? got : undefined;
    },
    60_000,
    `${interactionId} to take its answer`,
  );
  return answered.json as InteractionRequest;
}

test('an ask whose input, memo and webhook delivery would pass 4 MiB together is taken, listed whole and answered', async () => {
  // The ask as large as the input limit takes: a 1,000,000-character command (its own limit) and a
  // prompt of control characters (six bytes each in JSON) filling the rest.
  const base = { actionId: 'ask-big', action: { type: 'ask', ask: '', action: { command: 'c'.repeat(1_000_000) } } };
  const body = {
    ...base,
    action: { ...base.action, ask: '\u0001'.repeat(Math.floor((INPUT_LIMIT - jsonBytes(base)) / 6)) },
  };
  expect(jsonBytes(body)).toBeLessThanOrEqual(INPUT_LIMIT);
  expect(jsonBytes(body)).toBeGreaterThan(INPUT_LIMIT - 16);
  // Labels that kept the webhook delivery whole, just within its bound as it was (1.5 MiB).
  const labels = { note: 'n'.repeat(OLD_PAYLOAD_BOUND - jsonBytes(body) - 700) };
  const started = await agent('POST', '/api/v1/runs', {
    body: { agent: { driver: 'external' }, sandbox: { provider: 'local' }, policy: { pauseMode: 'DETACH' }, labels },
  });
  expect(started.status).toBe(201);
  const runId = (started.json as { runId: string }).runId;

  // A first, small ask answered: the Run then waits for the agent's next action, so the big ask's
  // Update, the memo and the delivery all come in one workflow task.
  const first = await agent('POST', `/api/v1/runs/${runId}/actions?waitMs=0`, {
    body: { actionId: 'ask-1', action: { type: 'ask', ask: 'ready?' } },
  });
  expect(first.status).toBeLessThan(300);
  const firstId = (await actionOnceIt(runId, 'ask-1', (v) => v.interactionId)).interactionId!;
  await approve(runId, firstId);
  await actionOnceIt(runId, 'ask-1', (v) => v.status === 'succeeded');

  const sent = await agent('POST', `/api/v1/runs/${runId}/actions?waitMs=0`, { body });
  // Before: 500 {"code":"INTERNAL","message":"run …: Workflow Update failed"}, the worker logging
  // "grpc: received message after decompression larger than max 4194304".
  expect(sent.json).toMatchObject({ actionId: 'ask-big' });
  expect(sent.status).toBeLessThan(300);
  const interactionId = (await actionOnceIt(runId, 'ask-big', (v) => v.interactionId)).interactionId!;
  expect(workerLogs.map((e) => e.message).join('\n')).not.toMatch(/larger than max|GRPC Message too large/i);

  // The delivery goes within its bound (now without the bulk: it was just within 1.5 MiB) ...
  const opened = await delivery(runId, 'interaction.opened', interactionId);
  expect(opened.truncated).toBe(true);
  expect(jsonBytes(opened)).toBeLessThanOrEqual(INTERACTION_PAYLOAD_MAX_BYTES);
  // ... and the memo only lists it, within its bound.
  const memo = (await api.stack.temporal.workflow.getHandle(runId).describe()).memo?.[PENDING_MEMO];
  expect(jsonBytes(memo)).toBeLessThanOrEqual(PENDING_MEMO_MAX_BYTES);
  expect(memo).toEqual([expect.objectContaining({ id: interactionId, status: 'pending', contentForgotten: true })]);

  // The approval page lists it whole, with the Run's labels (read from the Run's snapshot).
  const listed = await approver('GET', '/api/v1/interactions?limit=100');
  expect(listed.status).toBe(200);
  const mine = (
    listed.json as { interactions: { runId: string; interaction: InteractionRequest }[] }
  ).interactions.find((p) => p.runId === runId);
  expect(mine?.interaction).toMatchObject({ id: interactionId, labels, action: { command: 'c'.repeat(1_000_000) } });
  expect(mine?.interaction.contentForgotten).toBeUndefined();
  // What that task held before: the Update's input, the memo (this, whole) and the delivery (this
  // again, with its envelope): within 2 KiB of 4 MiB as JSON, and over it with the rest of the task
  // (the Update's response, the sandbox's activity and timer, search attributes, protobuf framing).
  const whole = jsonBytes([mine!.interaction]);
  expect(jsonBytes(body) + 2 * whole).toBeGreaterThan(GRPC_MESSAGE_LIMIT - 2048);

  // Answered, the ask succeeds, and the agent completes the Run.
  await approve(runId, interactionId);
  await actionOnceIt(runId, 'ask-big', (v) => v.status === 'succeeded');
  const done = await agent('POST', `/api/v1/runs/${runId}/actions`, {
    body: { actionId: 'done', action: { type: 'complete', output: { ok: true } } },
  });
  expect(done.status).toBeLessThan(300);
  await eventually(
    async () =>
      ((await approver('GET', `/api/v1/runs/${runId}`)).json as { status: string }).status === 'COMPLETED' || undefined,
    60_000,
    'COMPLETED',
  );
  // The memo's bound is part of PATCH_RUN_BASELINE_4: no patch asked on the way.
  for (const patches of await patchIdsOfEveryExecution(api.stack.config, runId)) {
    expect(patches).toEqual([PATCH_RUN_BASELINE_4]);
  }
});

test('an answer whose input, result and webhook delivery would pass 4 MiB together is taken', async () => {
  // An input answer of control characters (six bytes each in JSON) as large as the input limit takes,
  // and labels that kept the respond result and the interaction.answered delivery whole as they were.
  const input = '\u0001'.repeat(Math.floor((INPUT_LIMIT - 200) / 6));
  const labels = { note: 'n'.repeat(OLD_PAYLOAD_BOUND - jsonBytes({ input }) - 1_200) };
  const started = await agent('POST', '/api/v1/runs', {
    body: { agent: { driver: 'external' }, sandbox: { provider: 'local' }, policy: { pauseMode: 'DETACH' }, labels },
  });
  expect(started.status).toBe(201);
  const runId = (started.json as { runId: string }).runId;
  const sent = await agent('POST', `/api/v1/runs/${runId}/actions?waitMs=0`, {
    body: { actionId: 'ask-1', action: { type: 'ask', ask: 'name?', kind: 'input' } },
  });
  expect(sent.status).toBeLessThan(300);
  const interactionId = (await actionOnceIt(runId, 'ask-1', (v) => v.interactionId)).interactionId!;
  const answered = await eventually(
    async () => {
      const got = await approver('POST', `/api/v1/runs/${runId}/interactions/${interactionId}`, { body: { input } });
      return got.status === 409 ? undefined : got; // the Run takes answers once it has settled the ask
    },
    60_000,
    `${interactionId} to take its answer`,
  );
  // Before: 500 "Workflow Update failed" (the task: the answer, the result and the delivery, each whole).
  expect(answered.json).toMatchObject({ id: interactionId, status: 'answered', contentForgotten: true });
  expect(answered.status).toBe(200);
  expect(answered.bytes.length).toBeLessThanOrEqual(INTERACTION_PAYLOAD_MAX_BYTES);
  // The agent gets the whole answer.
  const done = await actionOnceIt(runId, 'ask-1', (v) => v.status === 'succeeded');
  expect(done.result).toMatchObject({ interactionId, input });
  const delivered = await delivery(runId, 'interaction.answered', interactionId);
  expect(delivered.truncated).toBe(true);
  expect(workerLogs.map((e) => e.message).join('\n')).not.toMatch(/larger than max|GRPC Message too large/i);
  await api.stack.client.runs.cancel(runId);
});
