import fc from 'fast-check';
import type { InteractionRequest } from '../../common/schemas';
import { apiOnStack } from './api-stack';
import { errorCode, type HttpResult } from './http';
import { releasedView } from '../helpers/runs';
import { eventually, saw } from '../helpers/stack';

// A hostile caller against the REST API: spellings of a route that a lower role may not
// call, and several people answering one interaction at once. Real API, worker and Temporal.

const APPROVERS = ['ana', 'ben', 'cy', 'dee'].map((name) => ({
  name,
  secret: `approver-${name}-secret-0123456789`,
  role: 'approver' as const,
}));
const AGENT = { name: 'bot', secret: 'agent-secret-0123456789', role: 'agent' } as const;
const OPERATOR = { name: 'ops', secret: 'operator-secret-0123456789', role: 'operator' } as const;

const api = apiOnStack([...APPROVERS, AGENT, OPERATOR]);
const as = api.as;

async function waitingRun(): Promise<string> {
  const { runId } = await api.stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        { ask: 'Which way?', options: ['left', 'right'], accepts: ['approve', 'deny', 'option'], onDeny: 'continue' },
        { complete: 'done' },
      ],
    },
    sandbox: { provider: 'local' },
  });
  await eventually(async () => saw(await api.stack.client.runs.get(runId)).status === 'WAITING', 90_000, 'waiting');
  // Its sandbox released too: the release writes history after the Run shows WAITING.
  await releasedView(api.stack.client, runId);
  return runId;
}

const head = (token: { secret: string }, path: string) =>
  fetch(`${api.base()}${path}`, { method: 'HEAD', headers: { authorization: `Bearer ${token.secret}` } });

const historyLength = async (runId: string): Promise<number> =>
  ((await api.stack.temporal.workflow.getHandle(runId).fetchHistory()).events ?? []).length;

test('property: no spelling of a route (method, slashes, case, encoding, dot segments) lets an approver or agent token past its role; nothing changes', async () => {
  const runId = await waitingRun();
  const { sandboxId } = await api.stack.client.sandboxes.create({ provider: 'local' });
  // Routes the token's role may not use, with a body each would take.
  const refused: { token: { name: string; secret: string }; method: string; path: string; body?: unknown }[] = [
    { token: AGENT, method: 'POST', path: `/api/v1/runs/${runId}/interactions/int-1`, body: { decision: 'approve' } },
    { token: APPROVERS[0], method: 'POST', path: `/api/v1/runs/${runId}/cancel` },
    { token: APPROVERS[0], method: 'POST', path: `/api/v1/runs/${runId}/suspend` },
    { token: APPROVERS[0], method: 'GET', path: `/api/v1/runs/${runId}/resource` },
    { token: APPROVERS[0], method: 'GET', path: `/api/v1/sandboxes/${sandboxId}/files?path=a.txt` },
    { token: APPROVERS[0], method: 'POST', path: `/api/v1/sandboxes/${sandboxId}/exec`, body: { command: 'true' } },
    { token: APPROVERS[0], method: 'DELETE', path: `/api/v1/sandboxes/${sandboxId}` },
    { token: APPROVERS[0], method: 'GET', path: '/api/v1/sandboxes' },
    {
      token: APPROVERS[0],
      method: 'POST',
      path: '/api/v1/runs',
      body: { agent: { driver: 'external' }, sandbox: { provider: 'local' } },
    },
  ];
  // Ways of spelling one path: each must reach the same route (and its refusal) or none at all.
  const spell = fc.constantFrom(
    (p: string) => p,
    (p: string) => `${p.split('?')[0]}/${p.includes('?') ? `?${p.split('?')[1]}` : ''}`,
    (p: string) => p.replace('/api/v1/', '/api//v1/'),
    (p: string) => p.replace('/api/v1/', '//api/v1/'),
    (p: string) => p.replace('/api/v1/', '/API/v1/'),
    (p: string) => p.replace('/api/v1/', '/api/v1/./'),
    (p: string) => p.replace('/api/v1/', '/api/v1/x/../'),
    (p: string) => p.replace('/api/v1/', '/api/v1/%2e%2e/v1/'),
    (p: string) => p.replace(/\//g, (s, at: number) => (at > 8 ? '%2F' : s)),
    (p: string) => p.replace('runs', 'r%75ns').replace('sandboxes', 'sandb%6Fxes'),
    (p: string) => p.replace('runs', 'ＲＵＮＳ'),
    (p: string) => `${p}${p.includes('?') ? '&' : '?'}role=admin`,
    (p: string) => `${p};role=admin`,
    (p: string) => `${p}#frag`,
  );
  const method = (m: string) => fc.constantFrom(m, m.toLowerCase(), m === 'GET' ? 'HEAD' : m);
  const before = { run: await historyLength(runId), sandbox: await api.stack.client.sandboxes.get(sandboxId) };
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...refused).chain((r) => fc.tuple(fc.constant(r), spell, method(r.method))),
      async ([route, spelling, verb]) => {
        // HEAD has no body to parse: its status says it all.
        const response =
          verb === 'HEAD'
            ? { status: (await head(route.token, spelling(route.path))).status, json: undefined }
            : await as(route.token)(verb.toUpperCase(), spelling(route.path), {
                ...(route.body !== undefined ? { body: route.body } : {}),
              });
        // Refused (403), unknown (404) or malformed (400): never served.
        expect({ route: route.path, verb, status: response.status, code: errorCode(response as HttpResult) }).toEqual({
          route: route.path,
          verb,
          status: expect.any(Number),
          code:
            verb.toUpperCase() === 'HEAD'
              ? undefined
              : expect.stringMatching(/^(FORBIDDEN|NOT_FOUND|INVALID_ARGUMENT)$/),
        });
        expect([400, 403, 404]).toContain(response.status);
      },
    ),
    { numRuns: 150 },
  );
  expect(await historyLength(runId)).toBe(before.run);
  expect(await api.stack.client.runs.get(runId)).toMatchObject({
    status: 'WAITING',
    interactions: [{ id: 'int-1', status: 'pending' }],
  });
  expect(await api.stack.client.sandboxes.get(sandboxId)).toEqual(before.sandbox);
  await api.stack.client.runs.cancel(runId);
  await api.stack.client.sandboxes.destroy(sandboxId);
}, 300_000);

test('property: people answering one interaction at once, over REST and by signal: exactly one answer is taken, and it is the one recorded', async () => {
  const answers = fc.constantFrom<unknown>(
    { decision: 'approve' },
    { decision: 'deny', comment: 'no' },
    { option: 'left' },
    { option: 'right', comment: 'this way' },
  );
  await fc.assert(
    fc.asyncProperty(
      fc.array(answers, { minLength: APPROVERS.length, maxLength: APPROVERS.length }),
      fc.array(answers, { minLength: 1, maxLength: 2 }),
      async (rest, signals) => {
        const runId = await waitingRun();
        const path = `/api/v1/runs/${runId}/interactions/int-1`;
        const [responses] = await Promise.all([
          Promise.all(APPROVERS.map((token, i) => as(token)('POST', path, { body: rest[i] }))),
          Promise.all(
            signals.map((response) =>
              api.stack.client.runs
                .respondBySignal(runId, 'int-1', response, { respondedBy: 'signaller' })
                // Once an answer is taken, the client refuses a signal as REST does.
                .catch((err: { code?: string }) => expect(err.code).toBe('ALREADY_ANSWERED')),
            ),
          ),
        ]);
        const taken = responses.flatMap((r, i) => (r.status === 200 ? [i] : []));
        for (const r of responses.filter((x) => x.status !== 200)) {
          expect({ status: r.status, code: errorCode(r) }).toEqual({ status: 409, code: 'ALREADY_ANSWERED' });
        }
        const final = await eventually(
          async () => {
            const run = saw(await api.stack.client.runs.get(runId));
            return run.status === 'COMPLETED' ? run : undefined;
          },
          120_000,
          'completed',
        );
        const interaction = final.interactions[0] as InteractionRequest;
        // At most one REST caller was told yes; if one was, its answer is the one recorded.
        expect(taken.length).toBeLessThanOrEqual(1);
        if (taken.length === 1) {
          expect(interaction).toMatchObject({
            status: 'answered',
            response: rest[taken[0]],
            respondedBy: APPROVERS[taken[0]].name,
          });
          expect(responses[taken[0]].json).toMatchObject({ id: 'int-1', status: 'answered', response: rest[taken[0]] });
        } else {
          // A signal won: every REST caller was refused, and the signal's answer stands.
          expect(interaction).toMatchObject({ status: 'answered', respondedBy: 'signaller' });
          expect(signals).toContainEqual(interaction.response);
        }
      },
    ),
    { numRuns: 4 },
  );
}, 600_000);

test('a Run may not take a standalone sandbox’s workflow id: 400 naming runId, nothing started', async () => {
  const { sandboxId } = await api.stack.client.sandboxes.create({ provider: 'local' });
  for (const runId of [`sandbox-${sandboxId}`, 'sandbox-not-yet-made']) {
    const started = await as(OPERATOR)('POST', '/api/v1/runs', {
      body: { runId, agent: { driver: 'external' }, sandbox: { provider: 'local' } },
    });
    expect({ status: started.status, code: errorCode(started) }).toEqual({ status: 400, code: 'INVALID_ARGUMENT' });
    expect(JSON.stringify(started.json)).toContain('runId');
  }
  await expect(api.stack.temporal.workflow.getHandle('sandbox-not-yet-made').describe()).rejects.toThrow(/not found/i);
  expect(await api.stack.client.sandboxes.get(sandboxId)).toMatchObject({ sandboxId });
  await api.stack.client.sandboxes.destroy(sandboxId);
}, 120_000);
