import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { ExecResult, RunSnapshot, SandboxView } from '../../common/schemas';
import { CLI } from '../cli/spawn';
import { eventually, startStack, type TestStack } from '../helpers/stack';

// `stasis mcp` as a real stdio process, driven by the SDK's client against the real worker.

let stack: TestStack;
let client: Client;
let transport: StdioClientTransport;
let stderr = '';

beforeAll(async () => {
  stack = await startStack();
  transport = new StdioClientTransport({
    command: CLI.command,
    args: [...CLI.args, 'mcp', '--as', 'agent-7'],
    cwd: CLI.cwd,
    env: {
      ...(process.env as Record<string, string>),
      STASIS_TASK_QUEUE: stack.config.STASIS_TASK_QUEUE,
      STASIS_DATA_DIR: stack.config.STASIS_DATA_DIR,
    },
    stderr: 'pipe',
  });
  transport.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  client = new Client({ name: 'stasis-test', version: '1.0.0' });
  await client.connect(transport);
});

afterAll(async () => {
  await client?.close();
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

test('lists the eight tools, each with an input schema', async () => {
  const { tools } = await client.listTools();
  expect(tools.map((t) => t.name).sort()).toEqual(
    [
      'interaction_respond',
      'run_start',
      'run_status',
      'sandbox_create',
      'sandbox_destroy',
      'sandbox_exec',
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

test('run_start → run_status → interaction_respond, recorded as the --as name', async () => {
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
