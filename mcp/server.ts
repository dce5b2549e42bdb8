import { McpServer, type ToolCallback } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import type { Method } from '../api/route';
import { apiRoutes } from '../api/routes';
import { errorBody, type Me } from '../api/schemas';
import { describeIssues, StasisError, toInternal } from '../common/errors';
import { allows, mayAnswer, type Role } from '../common/roles';
import { MAX_ACTION_WAIT_MS } from '../common/external-actions';
import {
  CreateSandboxInput,
  ExecInput,
  ExternalAction,
  Identifier,
  InteractionResponse,
  RunSpec,
  SandboxListFilter,
} from '../common/schemas';
import { jsonValueProblem } from '../common/wire-json';
import { version } from '../package.json';
import type { ApiClient } from './api-client';

// The MCP tools, for agents that drive Stasis themselves. The server is a
// client of the REST API with one token: the agent can do what that token's
// role allows and no more, and a tool its role cannot use is not offered.
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
    return refusal(toInternal(err));
  }
}

/** The least role that may make every one of these API calls, from the routes' own declarations. */
function roleFor(calls: [Method, string][]): Role {
  const routes = apiRoutes();
  const roles = calls.map(([method, path]) => {
    const route = routes.find((r) => r.method === method && r.path === path);
    if (!route?.role) throw new Error(`no /api route ${method} ${path}`);
    return route.role;
  });
  return roles.reduce((most, role) => (allows(most, role) ? most : role));
}

/** Whether one of these API calls answers an interaction (what an agent's token may not). */
function answersIn(calls: [Method, string][]): boolean {
  return apiRoutes().some((r) => r.answers && calls.some(([method, path]) => r.method === method && r.path === path));
}

/**
 * A tools/call request as this server takes it. Loose on purpose: the SDK's server then answers
 * arguments that are not an object with the protocol's "Invalid params" (-32602), where its own
 * request schema, failing first, would make them an "Internal error" (-32603).
 */
const ToolCall = z.object({
  method: z.literal('tools/call'),
  params: z.looseObject({ name: z.string(), arguments: z.unknown().optional() }),
});

/** Tool inputs are strict like REST bodies: an unknown field is refused, never silently dropped. */
const SandboxRef = z.object({ sandboxId: Identifier }).strict();

export function createMcpServer(api: ApiClient, me: Me): McpServer {
  const server = new McpServer({ name: 'stasis', version });
  const tools = new Map<string, { input: z.ZodType; run: (input: never) => Promise<unknown> }>();
  /** Registers a tool only when the token may make the API calls it makes. */
  const tool = <S extends z.ZodObject>(
    name: string,
    calls: [Method, string][],
    config: { description: string; inputSchema: S },
    run: (input: z.infer<S>) => Promise<unknown>,
  ) => {
    if (!allows(me.role, roleFor(calls)) || (!mayAnswer(me.role) && answersIn(calls))) return;
    tools.set(name, { input: config.inputSchema, run });
    // The SDK's callback type is conditional on the schema: TypeScript cannot see through it for a generic S.
    const callback = ((input: z.infer<S>) => result(() => run(input))) as ToolCallback<S>;
    server.registerTool<z.ZodObject, S>(name, config, callback);
  };

  tool(
    'run_start',
    [['POST', '/api/v1/runs']],
    { description: 'Start a Run from a RunSpec; returns {runId}.', inputSchema: z.object({ spec: RunSpec }).strict() },
    ({ spec }) => api.runs.start(spec),
  );
  tool(
    'run_status',
    [['GET', '/api/v1/runs/{id}']],
    {
      description: "A Run's status, interactions (with their ids), output and error.",
      inputSchema: z.object({ runId: Identifier }).strict(),
    },
    ({ runId }) => api.runs.get(runId),
  );
  tool(
    'interaction_respond',
    [['POST', '/api/v1/runs/{id}/interactions/{iid}']],
    {
      description: `Answer a Run's pending interaction, as ${me.name}: {decision: 'approve'|'deny', comment?}, {decision: 'edit', action: {command?, files?, diff?}, comment?} (approve with edited arguments), {input}, or {option, comment?}; the interaction's \`accepts\` lists which.`,
      inputSchema: z.object({ runId: Identifier, interactionId: Identifier, response: InteractionResponse }).strict(),
    },
    ({ runId, interactionId, response }) => api.runs.respond(runId, interactionId, response),
  );
  tool(
    'run_action',
    [['POST', '/api/v1/runs/{id}/actions']],
    {
      description:
        "Send a Run whose agent is {driver: 'external'} its next action: exec, writeFile, readFile, ask, spawn, complete or fail. " +
        'Returns the action with status succeeded/failed and its result, or running/waiting (an ask waits for a person) when ' +
        'waitMs (default 20000) ran out: then call run_action_result. Reusing an actionId returns the same outcome, never runs it twice.',
      inputSchema: z
        .object({
          runId: Identifier,
          actionId: Identifier,
          action: ExternalAction,
          waitMs: z.number().int().min(0).max(MAX_ACTION_WAIT_MS).optional(),
        })
        .strict(),
    },
    ({ runId, actionId, action, waitMs }) => api.runs.act(runId, { actionId, action }, waitMs),
  );
  tool(
    'run_action_result',
    [['GET', '/api/v1/runs/{id}/actions/{actionId}']],
    {
      description:
        "An action's status, and its result or error once finished (an ask's result is the person's answer).",
      inputSchema: z.object({ runId: Identifier, actionId: Identifier }).strict(),
    },
    ({ runId, actionId }) => api.runs.action(runId, actionId),
  );
  tool(
    'sandbox_create',
    [
      ['POST', '/api/v1/sandboxes'],
      ['POST', '/api/v1/sandboxes/{id}/start'],
    ],
    {
      description: 'Create a standalone sandbox and start it; returns the running sandbox with its sandboxId.',
      inputSchema: CreateSandboxInput,
    },
    async (input) => api.sandboxes.change((await api.sandboxes.create(input)).sandboxId, 'start'),
  );
  tool(
    'sandbox_list',
    [['GET', '/api/v1/sandboxes']],
    {
      description:
        'List sandboxes, newest first: filter by state (all but destroyed when absent) and labels ("key:value", all must match). ' +
        'Returns {sandboxes, nextPageToken?}: call again with nextPageToken for the next page.',
      inputSchema: SandboxListFilter.extend({ label: z.array(z.string()).optional() }).strict(),
    },
    (filter) => api.sandboxes.list(filter),
  );
  tool(
    'sandbox_exec',
    [['POST', '/api/v1/sandboxes/{id}/exec']],
    {
      description: 'Run a shell command in a running sandbox and wait for it; returns {exitCode, stdout, stderr}.',
      inputSchema: ExecInput.extend({ sandboxId: Identifier }).strict(),
    },
    ({ sandboxId, ...exec }) => api.sandboxes.exec(sandboxId, exec),
  );
  tool(
    'sandbox_suspend',
    [['POST', '/api/v1/sandboxes/{id}/suspend']],
    {
      description:
        'Release the sandbox compute and keep its workspace; refused (SANDBOX_SUSPEND_BUSY) while a command runs.',
      inputSchema: SandboxRef,
    },
    ({ sandboxId }) => api.sandboxes.change(sandboxId, 'suspend'),
  );
  tool(
    'sandbox_resume',
    [['POST', '/api/v1/sandboxes/{id}/resume']],
    { description: 'Bring a suspended (or paused) sandbox back to running.', inputSchema: SandboxRef },
    ({ sandboxId }) => api.sandboxes.change(sandboxId, 'resume'),
  );
  tool(
    'sandbox_destroy',
    [['DELETE', '/api/v1/sandboxes/{id}']],
    { description: 'Destroy the sandbox, its workspace and checkpoint.', inputSchema: SandboxRef },
    ({ sandboxId }) => api.sandboxes.destroy(sandboxId),
  );

  // The SDK answers a call it cannot take (unknown tool, arguments failing the schema) with text of its
  // own ("MCP error -32602: ..."); answer those like every other refusal. tools/list stays the SDK's.
  server.server.setRequestHandler(ToolCall, async ({ params }) => {
    const found = tools.get(params.name);
    if (!found) return refusal(new StasisError('NOT_FOUND', `tool ${JSON.stringify(params.name)} not found`));
    // The JSON rules of every surface first (common/wire-json.ts): the schema's records would drop a
    // `__proto__` key silently, and REST refuses it.
    const problem = jsonValueProblem(params.arguments ?? {}, 'arguments');
    if (problem) return refusal(new StasisError('INVALID_ARGUMENT', problem));
    const parsed = found.input.safeParse(params.arguments ?? {});
    if (!parsed.success) {
      const issues = parsed.error.issues.map((issue) => ({ ...issue, path: ['arguments', ...issue.path] }));
      return refusal(new StasisError('INVALID_ARGUMENT', describeIssues(issues)));
    }
    return result(() => found.run(parsed.data as never));
  });
  return server;
}
