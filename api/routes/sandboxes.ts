import { activeWorkspacesOfSandbox } from '../../common/host-paths';
import { CreateSandboxInput, ExecInput, ExecResult, SandboxPage, SandboxView } from '../../common/schemas';
import type { ErrorCode } from '../../common/errors';
import { defineRoute, type RouteDef } from '../route';
import { FileQuery, ListSandboxesQuery, SandboxParams } from '../schemas';

// Standalone sandboxes.

const CHANGE_ERRORS: ErrorCode[] = ['NOT_FOUND', 'INVALID_STATE_TRANSITION', 'STALE_SANDBOX_ROUTE', 'NOT_SUPPORTED'];

const CHANGES = {
  start: 'Start the sandbox (created or stopped → running)',
  stop: 'Stop every process; the workspace stays (running → stopped)',
  pause: 'Freeze the processes (running → paused)',
  resume: 'Thaw a paused sandbox or restore a suspended one (→ running)',
  suspend:
    'Release the compute and keep the workspace (running → suspended); 409 SANDBOX_SUSPEND_BUSY while a command runs',
} as const;

export function sandboxRoutes(): RouteDef[] {
  const changes = (Object.keys(CHANGES) as (keyof typeof CHANGES)[]).map((op) =>
    defineRoute({
      method: 'POST',
      path: `/api/v1/sandboxes/{id}/${op}`,
      summary: CHANGES[op],
      params: SandboxParams,
      status: 200,
      response: SandboxView,
      errors: op === 'suspend' ? [...CHANGE_ERRORS, 'SANDBOX_SUSPEND_BUSY'] : CHANGE_ERRORS,
      role: 'operator',
      handle: ({ params, client }) => client.sandboxes[op](params.id),
    }),
  );
  return [
    defineRoute({
      method: 'POST',
      path: '/api/v1/sandboxes',
      summary: 'Create a standalone sandbox (state created)',
      body: CreateSandboxInput,
      status: 201,
      response: SandboxView,
      errors: ['INVALID_ARGUMENT'],
      role: 'operator',
      adminField: (input) => activeWorkspacesOfSandbox(input)[0]?.field,
      handle: ({ body, client }) => client.sandboxes.create(body, { inputName: 'body' }),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/sandboxes',
      summary:
        'List sandboxes, newest first, by `state` (all but destroyed when absent) and `label=key:value` (repeatable, all must match); ' +
        'one page at a time: pass `nextPageToken` from the answer for the next',
      query: ListSandboxesQuery,
      status: 200,
      response: SandboxPage,
      errors: ['INVALID_ARGUMENT'],
      role: 'operator',
      handle: ({ query, client }) => {
        const { label, ...rest } = query;
        const labels = label === undefined ? {} : { label: Array.isArray(label) ? label : [label] };
        return client.sandboxes.list({ ...rest, ...labels }, { inputName: 'query' });
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/sandboxes/{id}',
      summary: 'A sandbox and its state',
      params: SandboxParams,
      status: 200,
      response: SandboxView,
      errors: ['NOT_FOUND'],
      role: 'operator',
      handle: ({ params, client }) => client.sandboxes.get(params.id),
    }),
    ...changes,
    defineRoute({
      method: 'POST',
      path: '/api/v1/sandboxes/{id}/exec',
      summary: 'Run a command in the sandbox and wait for it',
      params: SandboxParams,
      body: ExecInput,
      status: 200,
      response: ExecResult,
      errors: ['INVALID_ARGUMENT', 'NOT_FOUND', 'INVALID_STATE_TRANSITION', 'STALE_SANDBOX_ROUTE'],
      role: 'operator',
      handle: ({ params, body, client }) => client.sandboxes.exec(params.id, body),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/sandboxes/{id}/files',
      summary: 'Read a workspace file (raw bytes)',
      params: SandboxParams,
      query: FileQuery,
      status: 200,
      response: 'bytes',
      errors: ['INVALID_ARGUMENT', 'NOT_FOUND', 'INVALID_STATE_TRANSITION', 'STALE_SANDBOX_ROUTE'],
      role: 'operator',
      handle: ({ params, query, client }) => client.sandboxes.readFile(params.id, query.path),
    }),
    defineRoute({
      method: 'PUT',
      path: '/api/v1/sandboxes/{id}/files',
      summary: 'Write a workspace file (raw bytes)',
      params: SandboxParams,
      query: FileQuery,
      body: 'bytes',
      status: 204,
      response: 'none',
      errors: ['INVALID_ARGUMENT', 'NOT_FOUND', 'INVALID_STATE_TRANSITION', 'STALE_SANDBOX_ROUTE', 'PAYLOAD_TOO_LARGE'],
      role: 'operator',
      handle: ({ params, query, body, client }) => client.sandboxes.writeFile(params.id, query.path, body),
    }),
    defineRoute({
      method: 'DELETE',
      path: '/api/v1/sandboxes/{id}',
      summary: 'Destroy the sandbox, its workspace and checkpoint',
      params: SandboxParams,
      status: 200,
      response: SandboxView,
      errors: ['NOT_FOUND'],
      role: 'operator',
      handle: ({ params, client }) => client.sandboxes.destroy(params.id),
    }),
  ];
}
