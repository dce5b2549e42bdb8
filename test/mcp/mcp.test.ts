import { readFile } from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { FastifyInstance } from 'fastify';
import { buildApi } from '../../api/server';
import type { ActionView, ExecResult, RunSnapshot, SandboxPage, SandboxView } from '../../common/schemas';
import { CLI, runStasis } from '../cli/spawn';
import { eventually, startStack, type TestStack } from '../helpers/stack';

// `stasis mcp` as a real stdio process, driven by the SDK's client. It acts
// through the real REST API with one token, against the real worker.

const TOKENS = {
  approver: { name: 'reviewer-1', secret: 'approver-secret-0123456789', role: 'approver' },
  operator: { name: 'agent-7', secret: 'operator-secret-0123456789', role: 'operator' },
  admin: { name: 'root-agent', secret: 'admin-secret-0123456789xx', role: 'admin' },
  agent: { name: 'coding-agent', secret: 'agent-secret-0123456789xx', role: 'agent' },
} as const;

let stack: TestStack;
let api: FastifyInstance;
let apiUrl: string;
const clients: Client[] = [];
let client: Client;
let stderr = '';

/** A `stasis mcp` process acting with `secret`; its stderr goes to `log`. */
async function connectMcp(secret: string, log: (text: string) => void = () => undefined): Promise<Client> {
  const transport = new StdioClientTransport({
    command: CLI.command,
    args: [...CLI.args, 'mcp'],
    cwd: CLI.cwd,
    env: {
      ...(process.env as Record<string, string>),
      STASIS_API_URL: apiUrl,
      STASIS_API_TOKEN: secret,
      // Nothing but the API: a Temporal server it could reach directly would be a way around the token.
      TEMPORAL_ADDRESS: '127.0.0.1:1',
    },
    stderr: 'pipe',
  });
  transport.stderr?.on('data', (chunk: Buffer) => log(chunk.toString('utf8')));
  const mcp = new Client({ name: 'stasis-test', version: '1.0.0' });
  await mcp.connect(transport);
  clients.push(mcp);
  return mcp;
}

beforeAll(async () => {
  stack = await startStack();
  api = buildApi({ client: stack.client, tokens: Object.values(TOKENS), logger: false });
  await api.listen({ host: '127.0.0.1', port: 0 });
  const address = api.server.address();
  apiUrl = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
  client = await connectMcp(TOKENS.operator.secret, (text) => (stderr += text));
});

afterAll(async () => {
  for (const mcp of clients) await mcp.close();
  await api?.close();
  await stack?.stop();
});

async function call<T>(name: string, args: Record<string, unknown>): Promise<T> {
  const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
  const text = result.content[0]?.type === 'text' ? result.content[0].text : '';
  if (result.isError) throw new Error(`${name} failed: ${text}\n${stderr}`);
  return JSON.parse(text) as T;
}

async function refusal(name: string, args: Record<string, unknown>): Promise<{ code: string; message: string }> {
  const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
  expect(result.isError).toBe(true);
  const text = result.content[0]?.type === 'text' ? result.content[0].text : '';
  return (JSON.parse(text) as { error: { code: string; message: string } }).error;
}

test('lists the eleven tools to an operator, each with an input schema', async () => {
  const { tools } = await client.listTools();
  expect(tools.map((t) => t.name).sort()).toEqual(
    [
      'interaction_respond',
      'run_action',
      'run_action_result',
      'run_start',
      'run_status',
      'sandbox_create',
      'sandbox_destroy',
      'sandbox_exec',
      'sandbox_list',
      'sandbox_resume',
      'sandbox_suspend',
    ].sort(),
  );
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  expect(byName.sandbox_exec.inputSchema).toMatchObject({
    type: 'object',
    required: expect.arrayContaining(['sandboxId', 'command']),
  });
  expect(byName.run_start.inputSchema).toMatchObject({ type: 'object', required: ['spec'] });
  for (const tool of tools) expect(tool.description).toEqual(expect.any(String));
});

test('sandbox_create → exec → suspend → resume → exec → destroy', async () => {
  const created = await call<SandboxView>('sandbox_create', { provider: 'local' });
  expect(created).toMatchObject({ state: 'running', provider: 'local' });
  const id = created.sandboxId;

  const first = await call<ExecResult>('sandbox_exec', {
    sandboxId: id,
    command: 'echo kept > state.txt && cat state.txt',
  });
  expect(first).toEqual({ exitCode: 0, stdout: 'kept\n', stderr: '' });

  const suspended = await call<SandboxView>('sandbox_suspend', { sandboxId: id });
  expect(suspended.state).toBe('suspended');
  expect(suspended.record.state).toBe('RELEASED');
  const provider = stack.workers.get('host-a')!.registry.get('local');
  expect(await provider.processCount(id)).toBe(0);
  expect(await refusal('sandbox_exec', { sandboxId: id, command: 'true' })).toMatchObject({
    code: 'INVALID_STATE_TRANSITION',
  });

  const resumed = await call<SandboxView>('sandbox_resume', { sandboxId: id });
  expect(resumed.state).toBe('running');
  const second = await call<ExecResult>('sandbox_exec', { sandboxId: id, command: 'cat state.txt' });
  expect(second).toEqual({ exitCode: 0, stdout: 'kept\n', stderr: '' });

  expect((await call<SandboxView>('sandbox_destroy', { sandboxId: id })).state).toBe('destroyed');
  expect(await refusal('sandbox_exec', { sandboxId: id, command: 'true' })).toMatchObject({ code: 'NOT_FOUND' });
});

test('sandbox_list finds sandboxes by label, page by page, and names a bad filter', async () => {
  const tag = `suite:${process.pid}-${Date.now()}`;
  const labels = { suite: tag.slice('suite:'.length) };
  const a = await call<SandboxView>('sandbox_create', { provider: 'local', labels });
  const b = await call<SandboxView>('sandbox_create', { provider: 'local', labels });
  const first = await eventually(async () => {
    const page = await call<SandboxPage>('sandbox_list', { label: [tag], pageSize: 1 });
    return page.nextPageToken ? page : undefined;
  });
  // A full page may still say there is more; the page after the last sandbox has no token.
  const seen = first.sandboxes.map((s) => s.sandboxId);
  let token = first.nextPageToken;
  for (let pages = 1; token && pages < 5; pages += 1) {
    const page: SandboxPage = await call<SandboxPage>('sandbox_list', {
      label: [tag],
      pageSize: 1,
      nextPageToken: token,
    });
    seen.push(...page.sandboxes.map((s) => s.sandboxId));
    token = page.nextPageToken;
  }
  expect(token).toBeUndefined();
  expect(seen.sort()).toEqual([a.sandboxId, b.sandboxId].sort());
  expect(await refusal('sandbox_list', { label: ['no-colon'] })).toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining('label'),
  });
  // A real token damaged on the way (bytes added, cut short) is refused before Temporal sees it.
  const real = first.nextPageToken ?? '';
  for (const damaged of [`${real}AAAA`, real.slice(0, -4)])
    expect(await refusal('sandbox_list', { label: [tag], pageSize: 1, nextPageToken: damaged })).toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringContaining('nextPageToken'),
    });
});

test("run_start → run_status → interaction_respond, recorded under the token's name", async () => {
  const { runId } = await call<{ runId: string }>('run_start', {
    spec: {
      agent: { driver: 'scripted', steps: [{ ask: 'Proceed?' }, { complete: 'ok' }] },
      sandbox: { provider: 'local' },
    },
  });
  await eventually(
    async () => (await call<RunSnapshot>('run_status', { runId })).status === 'WAITING',
    60_000,
    'WAITING',
  );
  const answered = await call<{ status: string; respondedBy: string }>('interaction_respond', {
    runId,
    interactionId: 'int-1',
    response: { decision: 'approve' },
  });
  expect(answered).toMatchObject({ status: 'answered', respondedBy: 'agent-7' });
  expect(
    await refusal('interaction_respond', { runId, interactionId: 'int-1', response: { decision: 'deny' } }),
  ).toMatchObject({
    code: expect.stringMatching(/^(ALREADY_ANSWERED|INVALID_STATE_TRANSITION)$/),
  });
  const done = await eventually(
    async () => {
      const status = await call<RunSnapshot>('run_status', { runId });
      return status.status === 'COMPLETED' && status;
    },
    60_000,
    'COMPLETED',
  );
  expect(done.output).toBe('ok');
});

test('an external agent drives a Run to completion over MCP: actions, a worker restart, an ask answered', async () => {
  const { runId } = await call<{ runId: string }>('run_start', {
    spec: { agent: { driver: 'external' }, sandbox: { provider: 'local' } },
  });
  const act = (actionId: string, action: Record<string, unknown>) =>
    call<ActionView>('run_action', { runId, actionId, action, waitMs: 60_000 });
  expect(await act('w', { type: 'writeFile', path: 'todo.txt', content: 'ship it\n' })).toMatchObject({
    status: 'succeeded',
    result: { path: 'todo.txt', written: true },
  });
  await stack.stopWorker('host-a');
  await stack.startWorker('host-a');
  expect(await act('e', { type: 'exec', command: 'cat todo.txt' })).toMatchObject({
    status: 'succeeded',
    result: { exitCode: 0, stdout: 'ship it\n', stderr: '' },
  });
  // The same actionId again: the same outcome, not a second run.
  expect(await act('e', { type: 'exec', command: 'cat todo.txt' })).toEqual(
    await call('run_action_result', { runId, actionId: 'e' }),
  );

  const asked = await act('q', { type: 'ask', ask: 'Ship?', title: 'Ship the release' });
  expect(asked).toMatchObject({ status: 'waiting', interactionId: 'int-1' });
  await eventually(
    async () => (await call<RunSnapshot>('run_status', { runId })).status === 'WAITING',
    60_000,
    'WAITING',
  );
  await call('interaction_respond', {
    runId,
    interactionId: 'int-1',
    response: { decision: 'approve', comment: 'now' },
  });
  const answered = await eventually(
    async () => {
      const view = await call<ActionView>('run_action_result', { runId, actionId: 'q' });
      return view.status === 'succeeded' && view;
    },
    120_000,
    'the ask answered',
  );
  expect(answered.result).toEqual({
    interactionId: 'int-1',
    decision: 'approve',
    comment: 'now',
    respondedBy: 'agent-7',
  });

  expect(await act('done', { type: 'complete', output: 'shipped' })).toMatchObject({ status: 'succeeded' });
  await eventually(
    async () => (await call<RunSnapshot>('run_status', { runId })).status === 'COMPLETED',
    60_000,
    'COMPLETED',
  );
  expect(
    await refusal('run_action', { runId, actionId: 'late', action: { type: 'exec', command: 'true' } }),
  ).toMatchObject({
    code: 'INVALID_STATE_TRANSITION',
  });
  expect(await refusal('run_action', { runId, actionId: 'bad', action: { type: 'exec' } })).toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining('arguments.action.command'),
  });
  expect(await refusal('run_action_result', { runId, actionId: 'never-sent' })).toMatchObject({ code: 'NOT_FOUND' });
}, 300_000);

test('bad input and unknown ids are error results with the reason', async () => {
  const invalid = (await client.callTool({
    name: 'sandbox_exec',
    arguments: { sandboxId: 'sbx-x' },
  })) as CallToolResult;
  expect(invalid.isError).toBe(true);
  expect(JSON.stringify(invalid.content)).toContain('command');
  expect(await refusal('run_status', { runId: 'run-missing' })).toMatchObject({ code: 'NOT_FOUND' });
  const noSteps = (await client.callTool({
    name: 'run_start',
    arguments: { spec: { agent: { driver: 'scripted', steps: [] }, sandbox: { provider: 'local' } } },
  })) as CallToolResult;
  expect(noSteps.isError).toBe(true);
  expect(JSON.stringify(noSteps.content)).toContain('spec.agent');
});

/** Every Run and sandbox workflow this stack has seen (visibility), to show a refusal created nothing. */
async function workflowCount(): Promise<number> {
  let n = 0;
  for await (const _wf of stack.temporal.workflow.list({ query: `TaskQueue = '${stack.config.STASIS_TASK_QUEUE}'` }))
    n++;
  return n;
}

test('a `__proto__` key in env, labels or a spec is refused naming it, as REST refuses it, not silently dropped', async () => {
  const before = await workflowCount();
  // As a JSON-RPC line parses (the SDK's stdio transport sends it as written): `__proto__` an own key.
  const sandboxWith = JSON.parse('{"provider":"local","labels":{"team":"x","__proto__":"evil"}}') as Record<
    string,
    unknown
  >;
  expect(await refusal('sandbox_create', sandboxWith)).toEqual({
    code: 'INVALID_ARGUMENT',
    message: expect.stringMatching(/^arguments\.labels\.__proto__: the key "__proto__" is not accepted/),
  });
  const execWith = JSON.parse(
    '{"sandboxId":"sbx-none","command":"echo \\"[$__proto__]\\"","env":{"MARK":"m","\\u005f_proto__":"set"}}',
  ) as Record<string, unknown>;
  expect(await refusal('sandbox_exec', execWith)).toEqual({
    code: 'INVALID_ARGUMENT',
    message: expect.stringMatching(/^arguments\.env\.__proto__: /),
  });
  const specWith = JSON.parse(
    '{"spec":{"agent":{"driver":"scripted","steps":[{"complete":"x"}]},"sandbox":{"provider":"local","env":{"__proto__":"x"}}}}',
  ) as Record<string, unknown>;
  expect(await refusal('run_start', specWith)).toEqual({
    code: 'INVALID_ARGUMENT',
    message: expect.stringMatching(/^arguments\.spec\.sandbox\.env\.__proto__: /),
  });
  await new Promise((r) => setTimeout(r, 1500));
  expect(await workflowCount()).toBe(before);
});

describe('the token decides what the agent may do', () => {
  const waitingRun = async (): Promise<string> => {
    const { runId } = await stack.client.runs.start({
      agent: { driver: 'scripted', steps: [{ ask: 'Deploy?' }, { complete: 'deployed' }] },
      sandbox: { provider: 'local' },
    });
    await eventually(async () => (await stack.client.runs.get(runId)).status === 'WAITING', 60_000, 'WAITING');
    return runId;
  };

  test('an approver token is offered only run_status and interaction_respond; the others do not exist for it', async () => {
    const approver = await connectMcp(TOKENS.approver.secret);
    const { tools } = await approver.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual(['interaction_respond', 'run_status']);
    const before = await workflowCount();
    for (const [name, args] of [
      ['sandbox_create', { provider: 'local' }],
      [
        'run_start',
        { spec: { agent: { driver: 'scripted', steps: [{ complete: 1 }] }, sandbox: { provider: 'local' } } },
      ],
      ['sandbox_exec', { sandboxId: 'sbx-any', command: 'true' }],
    ] as const) {
      const outcome = await approver.callTool({ name, arguments: args }).then(
        (r) => JSON.stringify((r as CallToolResult).content),
        (err: Error) => err.message,
      );
      expect(outcome).toMatch(/not found/i);
    }
    // It answers as itself.
    const runId = await waitingRun();
    const result = (await approver.callTool({
      name: 'interaction_respond',
      arguments: { runId, interactionId: 'int-1', response: { decision: 'approve' } },
    })) as CallToolResult;
    expect(result.isError).toBeFalsy();
    expect((await stack.client.runs.get(runId)).interactions[0]).toMatchObject({ respondedBy: 'reviewer-1' });
    // Nothing was created by the refused calls: only the waiting Run of this test is new.
    await eventually(async () => (await workflowCount()) === before + 1, 30_000, 'one new workflow');
  });

  test('an agent token drives Runs and sandboxes but is never offered answering; its interaction waits for a person', async () => {
    const agent = await connectMcp(TOKENS.agent.secret);
    const { tools } = await agent.listTools();
    expect(tools.map((t) => t.name)).toContain('run_start');
    expect(tools.map((t) => t.name)).toContain('sandbox_exec');
    expect(tools.map((t) => t.name)).not.toContain('interaction_respond');
    const runId = await waitingRun();
    const outcome = await agent
      .callTool({
        name: 'interaction_respond',
        arguments: { runId, interactionId: 'int-1', response: { decision: 'approve' } },
      })
      .then(
        (r) => JSON.stringify((r as CallToolResult).content),
        (err: Error) => err.message,
      );
    expect(outcome).toMatch(/not found/i);
    expect((await stack.client.runs.get(runId)).interactions[0]).toMatchObject({ status: 'pending' });
  });

  test('an operator token cannot give a Run or a sandbox an active workspace on a host path (403 FORBIDDEN)', async () => {
    const hostPath = path.join(os.tmpdir(), `mcp-active-${process.pid}`);
    const active = { kind: 'active', hostPath };
    const before = await workflowCount();
    const refusals = [
      await refusal('sandbox_create', { provider: 'local', workspace: active }),
      await refusal('run_start', {
        spec: {
          agent: { driver: 'scripted', steps: [{ complete: 1 }] },
          sandbox: { provider: 'local', workspace: active },
        },
      }),
      // Nor through a child Run.
      await refusal('run_start', {
        spec: {
          agent: {
            driver: 'scripted',
            steps: [
              {
                spawn: {
                  agent: { driver: 'scripted', steps: [{ complete: 1 }] },
                  sandbox: { provider: 'local', workspace: active },
                },
              },
            ],
          },
          sandbox: { provider: 'local' },
        },
      }),
    ];
    expect(refusals.map((r) => r.code)).toEqual(['FORBIDDEN', 'FORBIDDEN', 'FORBIDDEN']);
    expect(refusals[0].message).toContain('body.workspace.hostPath');
    expect(refusals[2].message).toContain('body.agent.steps.0.spawn.sandbox.workspace.hostPath');
    expect(await workflowCount()).toBe(before);
  });

  test('an admin token may, but only under STASIS_HOST_PATHS: / and paths outside are refused before anything is created', async () => {
    const admin = await connectMcp(TOKENS.admin.secret);
    const before = await workflowCount();
    for (const hostPath of ['/', '/etc', `${os.tmpdir()}/../etc`, stack.config.STASIS_DATA_DIR]) {
      const result = (await admin.callTool({
        name: 'sandbox_create',
        arguments: { provider: 'local', workspace: { kind: 'active', hostPath } },
      })) as CallToolResult;
      expect(result.isError).toBe(true);
      const text = result.content[0]?.type === 'text' ? result.content[0].text : '';
      expect(JSON.parse(text)).toMatchObject({
        error: { code: 'INVALID_ARGUMENT', message: expect.stringContaining('workspace.hostPath') },
      });
    }
    expect(await workflowCount()).toBe(before);
    const hostPath = path.join(os.tmpdir(), `mcp-admin-${process.pid}`);
    const created = (await admin.callTool({
      name: 'sandbox_create',
      arguments: { provider: 'local', workspace: { kind: 'active', hostPath } },
    })) as CallToolResult;
    expect(created.isError).toBeFalsy();
    const view = JSON.parse(created.content[0]?.type === 'text' ? created.content[0].text : '') as SandboxView;
    await stack.client.sandboxes.exec(view.sandboxId, { command: 'echo here > mark.txt' });
    expect(await readFile(path.join(hostPath, 'mark.txt'), 'utf8')).toBe('here\n');
    await stack.client.sandboxes.destroy(view.sandboxId);
  });

  test('a wrong token does not start: the error says so and does not print the secret', async () => {
    const wrong = 'not-a-configured-secret-42';
    const outcome = await runStasis(['mcp'], { ...process.env, STASIS_API_URL: apiUrl, STASIS_API_TOKEN: wrong });
    expect(outcome.code).not.toBe(0);
    expect(outcome.stderr).toContain('UNAUTHORIZED');
    expect(outcome.stderr + outcome.stdout).not.toContain(wrong);
    const unset = await runStasis(['mcp'], { ...process.env, STASIS_API_URL: '', STASIS_API_TOKEN: '' });
    expect(unset.code).toBe(2);
    expect(unset.stderr).toContain('STASIS_API_TOKEN: must be set');
  });
});
