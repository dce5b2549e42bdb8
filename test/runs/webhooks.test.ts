import { createHmac } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as fc from 'fast-check';
import { signWebhook, verifyWebhook, type WebhookPayload } from '../../common/webhooks';
import { eventually, startStack, unprintedWorkerLogs, type TestStack } from '../helpers/stack';

// Webhook notifications against a real HTTP receiver started here: signed,
// durable (a receiver that is down gets them once it is back) and never in the
// Run's way.

const SECRET = 'whsec-0123456789abcdef';
const PUBLIC_URL = 'https://approvals.example.com/stasis';

interface Received {
  headers: Record<string, string | string[] | undefined>;
  body: string;
  payload: WebhookPayload;
}

/** A receiver that checks the signature the documented way (HMAC-SHA256 of "<t>.<body>") and keeps what it accepted. */
class Receiver {
  readonly accepted: Received[] = [];
  refused = 0;
  private server?: Server;
  constructor(
    readonly port: number,
    public secret: string,
  ) {}

  async start(): Promise<void> {
    this.server = createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on('data', (chunk: Buffer) => chunks.push(chunk));
      request.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        const header = String(request.headers['stasis-signature'] ?? '');
        const [, t, v1] = /^t=([0-9]+),v1=([0-9a-f]{64})$/.exec(header) ?? [];
        const expected = t ? createHmac('sha256', this.secret).update(`${t}.${body}`).digest('hex') : undefined;
        const fresh = t !== undefined && Math.abs(Date.now() / 1000 - Number(t)) < 300;
        if (!expected || expected !== v1 || !fresh || !verifyWebhook(this.secret, header, body)) {
          this.refused += 1;
          response.writeHead(401).end();
          return;
        }
        this.accepted.push({ headers: request.headers, body, payload: JSON.parse(body) as WebhookPayload });
        response.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(this.port, '127.0.0.1', resolve));
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** The accepted events of one Run, each delivery id once (delivery is at least once). */
  events(runId: string): WebhookPayload[] {
    const seen = new Set<string>();
    return this.accepted
      .map((r) => r.payload)
      .filter((p) => p.runId === runId && !seen.has(p.deliveryId) && seen.add(p.deliveryId));
  }
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

let stack: TestStack;
let receiver: Receiver;
// Deliveries to a receiver that is down fail by design here, attempt after attempt.
unprintedWorkerLogs.push(/^Activity failed$/);
beforeAll(async () => {
  receiver = new Receiver(await freePort(), SECRET);
  stack = await startStack({
    env: {
      STASIS_WEBHOOK_URL: `http://127.0.0.1:${receiver.port}/hooks/stasis`,
      STASIS_WEBHOOK_SECRET: SECRET,
      STASIS_PUBLIC_URL: PUBLIC_URL,
    },
  });
});
afterAll(async () => {
  await stack?.stop();
  await receiver?.stop();
});

const spec = (steps: unknown[]) => ({
  agent: { driver: 'scripted', steps },
  sandbox: { provider: 'local' },
  labels: { team: 'web' },
});

const status = (runId: string, wanted: string) =>
  eventually(
    async () => {
      const snapshot = await stack.client.runs.get(runId);
      return snapshot.status === wanted && snapshot;
    },
    60_000,
    wanted,
  );

test('opened, answered and ended are POSTed, signed, with the deep link to the interaction', async () => {
  await receiver.start();
  const { runId } = await stack.client.runs.start(
    spec([{ ask: 'Ship it?', title: 'Ship web-42' }, { complete: 'shipped' }]),
  );
  await status(runId, 'WAITING');
  const opened = await eventually(
    async () => receiver.events(runId).find((e) => e.event === 'interaction.opened'),
    60_000,
    'opened',
  );
  expect(opened).toMatchObject({
    runId,
    status: 'WAITING',
    labels: { team: 'web' },
    interaction: {
      id: 'int-1',
      title: 'Ship web-42',
      prompt: 'Ship it?',
      status: 'pending',
      accepts: ['approve', 'deny'],
    },
    link: `${PUBLIC_URL}/#/runs/${runId}/interactions/int-1`,
  });
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve', comment: 'go' }, { respondedBy: 'erin' });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('shipped');
  // The workflow closes only once the receiver has everything.
  const events = receiver.events(runId);
  expect(events.map((e) => e.event)).toEqual(['interaction.opened', 'interaction.answered', 'run.ended']);
  expect(events[1].interaction).toMatchObject({
    status: 'answered',
    respondedBy: 'erin',
    response: { decision: 'approve', comment: 'go' },
  });
  expect(events[2]).toMatchObject({ status: 'COMPLETED' });
  expect(events[2]).not.toHaveProperty('link');
  for (const r of receiver.accepted.filter((a) => a.payload.runId === runId)) {
    expect(r.headers['stasis-delivery']).toBe(r.payload.deliveryId);
    expect(r.headers['stasis-event']).toBe(r.payload.event);
    expect(r.headers['content-type']).toBe('application/json');
  }
  expect(new Set(events.map((e) => e.deliveryId)).size).toBe(3);
  await receiver.stop();
});

test('a receiver down for a while gets every delivery once it is back, and the Run is not held up meanwhile', async () => {
  await receiver.stop();
  const { runId } = await stack.client.runs.start(
    spec([{ ask: 'Deploy?', onDeny: 'continue' }, { exec: 'echo after' }]),
  );
  // The Run asks, waits, is answered and ends while nothing can be delivered.
  await status(runId, 'WAITING');
  await stack.client.runs.respond(runId, 'int-1', { decision: 'deny' });
  const done = await status(runId, 'COMPLETED');
  expect(done.output).toMatchObject({ stdout: 'after\n' });
  expect(receiver.events(runId)).toEqual([]);
  const handle = stack.temporal.workflow.getHandle(runId);
  expect((await handle.describe()).status.name).toBe('RUNNING');

  await receiver.start();
  const events = await eventually(
    async () => {
      const got = receiver.events(runId);
      return got.length === 3 && got;
    },
    120_000,
    'the three deliveries after the receiver came back',
  );
  expect(events.map((e) => e.event).sort()).toEqual(['interaction.answered', 'interaction.opened', 'run.ended']);
  expect(events.find((e) => e.event === 'interaction.answered')?.interaction?.response).toEqual({ decision: 'deny' });
  await expect(handle.result()).resolves.toMatchObject({ stdout: 'after\n' });
  await receiver.stop();
});

test('a receiver checking with another key refuses the deliveries; they are retried until it takes them', async () => {
  receiver.secret = 'not-the-secret-at-all';
  await receiver.start();
  const refusedBefore = receiver.refused;
  const { runId } = await stack.client.runs.start(spec([{ complete: 'quick' }]));
  await status(runId, 'COMPLETED');
  await eventually(async () => receiver.refused > refusedBefore, 60_000, 'a refused delivery');
  expect(receiver.events(runId)).toEqual([]);
  receiver.secret = SECRET;
  const [ended] = await eventually(
    async () => receiver.events(runId).length > 0 && receiver.events(runId),
    120_000,
    'the retried delivery',
  );
  expect(ended).toMatchObject({ event: 'run.ended', status: 'COMPLETED' });
  await receiver.stop();
});

test('an interaction left past the retention expires: interaction.expired, then run.ended', async () => {
  await receiver.start();
  const { runId } = await stack.client.runs.start({
    ...spec([{ ask: 'Anyone there?' }]),
    policy: { suspendedRetentionSeconds: 2 },
  });
  await status(runId, 'EXPIRED');
  const events = await eventually(
    async () => {
      const got = receiver.events(runId);
      return got.length === 3 && got;
    },
    60_000,
    'opened, expired and ended',
  );
  // Each delivery is its own activity, so they may arrive in any order; the number that ends the
  // delivery id is the order the Run sent them in.
  const sent = (e: WebhookPayload) => Number(e.deliveryId.split('-').pop());
  events.sort((a, b) => sent(a) - sent(b));
  expect(events.map((e) => e.event)).toEqual(['interaction.opened', 'interaction.expired', 'run.ended']);
  expect(events[1]).toMatchObject({
    interaction: { id: 'int-1', status: 'expired' },
    link: `${PUBLIC_URL}/#/runs/${runId}/interactions/int-1`,
  });
  expect(events[2]).toMatchObject({ status: 'EXPIRED' });
  await receiver.stop();
});

// A delivery's input carries the Run's labels and the interaction: labels, a reviewed command and an
// input answer of 700 KB each made it 2.1 MB, Temporal refused to start the delivery
// (BadStartChildExecutionAttributes) and terminated the Run (found by an attack review). Past the
// bound the delivery goes without the labels and the interaction's bulk, marked truncated. (450 KB
// each: the bound is 1 MiB, so that the workflow task that takes an answer stays within gRPC's 4 MiB.)
test('an answer too large to deliver whole is delivered truncated, and the Run lives', async () => {
  await receiver.start();
  const big = 450_000;
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'external' },
    sandbox: { provider: 'local' },
    policy: { pauseMode: 'DETACH' },
    labels: { note: 'n'.repeat(big) },
  });
  await stack.client.runs.act(
    runId,
    { actionId: 'ask-1', action: { type: 'ask', ask: 'name?', kind: 'input', action: { command: 'c'.repeat(big) } } },
    { waitMs: 0 },
  );
  const interactionId = await eventually(
    async () => (await stack.client.runs.action(runId, 'ask-1'))?.interactionId,
    60_000,
    'the ask to open its interaction',
  );
  await stack.client.runs.respondBySignal(runId, interactionId, { input: 'i'.repeat(big) }, { respondedBy: 'alice' });
  const answered = await eventually(
    async () => receiver.events(runId).find((e) => e.event === 'interaction.answered'),
    60_000,
    'interaction.answered',
  );
  expect(answered).toMatchObject({
    truncated: true,
    interaction: { id: interactionId, status: 'answered', respondedBy: 'alice', contentForgotten: true },
    link: `${PUBLIC_URL}/#/runs/${runId}/interactions/${interactionId}`,
  });
  expect(answered.labels).toBeUndefined();
  // The one within the bound went whole.
  const opened = receiver.events(runId).find((e) => e.event === 'interaction.opened');
  expect(opened?.truncated).toBeUndefined();
  expect(opened?.labels).toEqual({ note: 'n'.repeat(big) });
  await eventually(
    async () => ((await stack.client.runs.action(runId, 'ask-1'))?.status === 'succeeded' ? true : undefined),
    60_000,
    'the ask to succeed',
  );
  expect((await stack.temporal.workflow.getHandle(runId).describe()).status.name).toBe('RUNNING');
  await stack.client.runs.cancel(runId);
  await status(runId, 'CANCELLED');
  await receiver.stop();
});

test('property: a signature verifies only for its key, its exact body, and a fresh timestamp', () => {
  fc.assert(
    fc.property(
      fc.string({ minLength: 16 }),
      fc.string({ minLength: 16 }),
      fc.string(),
      fc.string({ minLength: 1 }),
      fc.integer({ min: 1_700_000_000, max: 2_000_000_000 }),
      (key, otherKey, body, extra, now) => {
        const header = signWebhook(key, now, body);
        expect(verifyWebhook(key, header, body, { nowSeconds: now + 10 })).toBe(true);
        expect(verifyWebhook(key, header, body + extra, { nowSeconds: now })).toBe(false);
        if (otherKey !== key) expect(verifyWebhook(otherKey, header, body, { nowSeconds: now })).toBe(false);
        expect(verifyWebhook(key, header, body, { nowSeconds: now + 301 })).toBe(false);
        expect(verifyWebhook(key, header.replace(/v1=./, 'v1=g'), body, { nowSeconds: now })).toBe(false);
        expect(verifyWebhook(key, undefined, body, { nowSeconds: now })).toBe(false);
      },
    ),
  );
});
