import { toStasisError } from '../../client/errors';
import { apiOnStack } from './api-stack';
import { errorCode } from './http';

// A sandbox's workflow id (`sandbox-<sandboxId>`) names no Run: a RunSpec may not take one. Run
// routes given one answered 500 (the sandbox's workflow has no `snapshot` query, no `respond` Update).

const ADMIN = { name: 'root-ops', secret: 'admin-secret-0123456789', role: 'admin' } as const;
const api = apiOnStack([ADMIN]);
const admin = api.as(ADMIN);

test('Run routes given a sandbox workflow id answer 404 NOT_FOUND and leave the sandbox alone', async () => {
  const created = await admin('POST', '/api/v1/sandboxes', { body: { provider: 'local' } });
  expect(created.status).toBe(201);
  const sandboxId = (created.json as { sandboxId: string }).sandboxId;
  const before = (await admin('GET', `/api/v1/sandboxes/${sandboxId}`)).json as { state: string };
  const wf = `sandbox-${sandboxId}`;
  const routes: [string, string, unknown?][] = [
    ['GET', `/api/v1/runs/${wf}`],
    ['POST', `/api/v1/runs/${wf}/interactions/int-1`, { decision: 'approve' }],
    ['POST', `/api/v1/runs/${wf}/suspend`],
    ['POST', `/api/v1/runs/${wf}/resume`],
    ['POST', `/api/v1/runs/${wf}/cancel`],
    ['GET', `/api/v1/runs/${wf}/resource`],
    ['POST', `/api/v1/runs/${wf}/actions`, { actionId: 'x', action: { type: 'exec', command: 'touch ran' } }],
    ['GET', `/api/v1/runs/${wf}/actions/x`],
  ];
  for (const [method, path, body] of routes) {
    const answer = await admin(method, path, body === undefined ? {} : { body });
    expect([method, path, answer.status, errorCode(answer)]).toEqual([method, path, 404, 'NOT_FOUND']);
  }
  expect(((await admin('GET', `/api/v1/sandboxes/${sandboxId}`)).json as { state: string }).state).toBe(before.state);
  await expect(api.stack.client.runs.get(wf)).rejects.toMatchObject({ code: 'NOT_FOUND' });
});

test('a query or Update the workflow has no handler for is NOT_FOUND, not INTERNAL', async () => {
  const sandboxId = (
    (await admin('POST', '/api/v1/sandboxes', { body: { provider: 'local' } })).json as { sandboxId: string }
  ).sandboxId;
  // Straight through Temporal, past the client's check of the id: what the workflow itself answers.
  const handle = api.stack.temporal.workflow.getHandle(`sandbox-${sandboxId}`);
  const query = await handle.query('snapshot').catch((err: unknown) => err);
  expect(toStasisError(query, 'run x')).toMatchObject({ code: 'NOT_FOUND' });
  const update = await handle.executeUpdate('respond', { args: [{}] }).catch((err: unknown) => err);
  expect(toStasisError(update, 'run x')).toMatchObject({ code: 'NOT_FOUND' });
});
