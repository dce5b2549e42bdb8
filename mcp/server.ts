import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { CallToolRequestSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { errorBody } from '../api/schemas';
import type { StasisClient } from '../client';
import { describeIssues, StasisError } from '../common/errors';
import { CreateSandboxInput, ExecInput, Identifier, InteractionResponse, RunSpec } from '../common/schemas';
import { version } from '../package.json';

// The MCP tools of SPEC section 5, for agents that drive Stasis themselves.
// Inputs are the wire schemas; results are JSON text; a refusal is an isError
// result carrying `{error: {code, message}}` so the agent can act on the code.

const text = (value: unknown): CallToolResult => ({
  content: [{ type: 'text', text: JSON.stringify(value, null, 2) }],
});

const refusal = (failure: StasisError): CallToolResult => ({ ...text(errorBody(failure)), isError: true });

async function result(run: () => Promise<unknown>): Promise<CallToolResult> {
  try {
    return text(await run());
  } catch (err) {
    return refusal(
      err instanceof StasisError ? err : new StasisError('INTERNAL', err instanceof Error ? err.message : String(err)),
    );
  }
}

/** Tool inputs are strict like REST bodies: an unknown field is refused, never silently dropped. */
const SandboxRef = z.object({ sandboxId: Identifier }).strict();

export function createMcpServer(client: StasisClient, options: { respondedBy?: string } = {}): McpServer {
  const server = new McpServer({ name: 'stasis', version });
  const tools = new Map<string, { input: z.ZodType; run: (input: never) => Promise<unknown> }>();
  const tool = <S extends z.ZodObject>(
    name: string,
    description: string,
    input: S,
    run: (input: z.infer<S>) => Promise<unknown>,
  ) => {
    tools.set(name, { input, run });
    server.registerTool(name, { description, inputSchema: input }, ((args: z.infer<S>) =>
      result(() => run(args))) as never);
  };

  tool('run_start', 'Start a Run from a RunSpec; returns {runId}.', z.object({ spec: RunSpec }).strict(), ({ spec }) =>
    client.runs.start(spec),
  );
  tool(
    'run_status',
    "A Run's status, interactions (with their ids), output and error.",
    z.object({ runId: Identifier }).strict(),
    ({ runId }) => client.runs.get(runId),
  );
  tool(
    'interaction_respond',
    "Answer a Run's pending interaction: {decision: 'approve'|'deny', comment?} or {input}.",
    z.object({ runId: Identifier, interactionId: Identifier, response: InteractionResponse }).strict(),
    ({ runId, interactionId, response }) =>
      client.runs.respond(runId, interactionId, response, { respondedBy: options.respondedBy ?? 'mcp' }),
  );
  tool(
    'sandbox_create',
    'Create a standalone sandbox and start it; returns the running sandbox with its sandboxId.',
    CreateSandboxInput,
    async (input) => client.sandboxes.start((await client.sandboxes.create(input)).sandboxId),
  );
  tool(
    'sandbox_exec',
    'Run a shell command in a running sandbox and wait for it; returns {exitCode, stdout, stderr}.',
    ExecInput.extend({ sandboxId: Identifier }).strict(),
    ({ sandboxId, ...exec }) => client.sandboxes.exec(sandboxId, exec),
  );
  tool(
    'sandbox_suspend',
    'Release the sandbox compute and keep its workspace; refused (SANDBOX_SUSPEND_BUSY) while a command runs.',
    SandboxRef,
    ({ sandboxId }) => client.sandboxes.suspend(sandboxId),
  );
  tool('sandbox_resume', 'Bring a suspended (or paused) sandbox back to running.', SandboxRef, ({ sandboxId }) =>
    client.sandboxes.resume(sandboxId),
  );
  tool('sandbox_destroy', 'Destroy the sandbox, its workspace and checkpoint.', SandboxRef, ({ sandboxId }) =>
    client.sandboxes.destroy(sandboxId),
  );

  // The SDK answers a call it cannot take (unknown tool, arguments failing the schema) with text of its
  // own ("MCP error -32602: ..."); answer those like every other refusal. tools/list stays the SDK's.
  server.server.setRequestHandler(CallToolRequestSchema, async ({ params }) => {
    const found = tools.get(params.name);
    if (!found) return refusal(new StasisError('NOT_FOUND', `no tool ${JSON.stringify(params.name)}`));
    const parsed = found.input.safeParse(params.arguments ?? {});
    if (!parsed.success) {
      const issues = parsed.error.issues.map((issue) => ({ ...issue, path: ['arguments', ...issue.path] }));
      return refusal(new StasisError('INVALID_ARGUMENT', describeIssues(issues)));
    }
    return result(() => found.run(parsed.data as never));
  });
  return server;
}
