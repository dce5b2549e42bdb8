import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { errorBody } from '../api/schemas';
import type { StasisClient } from '../client';
import { StasisError } from '../common/errors';
import { CreateSandboxInput, ExecInput, Identifier, InteractionResponse, RunSpec } from '../common/schemas';
import { version } from '../package.json';

// The MCP tools of SPEC section 5, for agents that drive Stasis themselves.
// Inputs are the wire schemas; results are JSON text; a refusal is an isError
// result carrying `{error: {code, message}}` so the agent can act on the code.

const text = (value: unknown): CallToolResult => ({
  content: [{ type: 'text', text: JSON.stringify(value, null, 2) }],
});

async function result(run: () => Promise<unknown>): Promise<CallToolResult> {
  try {
    return text(await run());
  } catch (err) {
    const failure =
      err instanceof StasisError ? err : new StasisError('INTERNAL', err instanceof Error ? err.message : String(err));
    return { ...text(errorBody(failure)), isError: true };
  }
}

const SandboxRef = z.object({ sandboxId: Identifier });

export function createMcpServer(client: StasisClient, options: { respondedBy?: string } = {}): McpServer {
  const server = new McpServer({ name: 'stasis', version });
  server.registerTool(
    'run_start',
    { description: 'Start a Run from a RunSpec; returns {runId}.', inputSchema: z.object({ spec: RunSpec }) },
    ({ spec }) => result(() => client.runs.start(spec)),
  );
  server.registerTool(
    'run_status',
    {
      description: "A Run's status, interactions (with their ids), output and error.",
      inputSchema: z.object({ runId: Identifier }),
    },
    ({ runId }) => result(() => client.runs.get(runId)),
  );
  server.registerTool(
    'interaction_respond',
    {
      description: "Answer a Run's pending interaction: {decision: 'approve'|'deny', comment?} or {input}.",
      inputSchema: z.object({ runId: Identifier, interactionId: Identifier, response: InteractionResponse }),
    },
    ({ runId, interactionId, response }) =>
      result(() => client.runs.respond(runId, interactionId, response, { respondedBy: options.respondedBy ?? 'mcp' })),
  );
  server.registerTool(
    'sandbox_create',
    {
      description: 'Create a standalone sandbox and start it; returns the running sandbox with its sandboxId.',
      inputSchema: CreateSandboxInput,
    },
    (input) => result(async () => client.sandboxes.start((await client.sandboxes.create(input)).sandboxId)),
  );
  server.registerTool(
    'sandbox_exec',
    {
      description: 'Run a shell command in a running sandbox and wait for it; returns {exitCode, stdout, stderr}.',
      inputSchema: ExecInput.extend({ sandboxId: Identifier }),
    },
    ({ sandboxId, ...exec }) => result(() => client.sandboxes.exec(sandboxId, exec)),
  );
  server.registerTool(
    'sandbox_suspend',
    {
      description:
        'Release the sandbox compute and keep its workspace; refused (SANDBOX_SUSPEND_BUSY) while a command runs.',
      inputSchema: SandboxRef,
    },
    ({ sandboxId }) => result(() => client.sandboxes.suspend(sandboxId)),
  );
  server.registerTool(
    'sandbox_resume',
    { description: 'Bring a suspended (or paused) sandbox back to running.', inputSchema: SandboxRef },
    ({ sandboxId }) => result(() => client.sandboxes.resume(sandboxId)),
  );
  server.registerTool(
    'sandbox_destroy',
    { description: 'Destroy the sandbox, its workspace and checkpoint.', inputSchema: SandboxRef },
    ({ sandboxId }) => result(() => client.sandboxes.destroy(sandboxId)),
  );
  return server;
}
