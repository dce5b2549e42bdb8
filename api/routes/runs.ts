import type { StasisClient } from '../../client';
import { InteractionRequest, InteractionResponse, ResourceView, RunSnapshot, RunSpec } from '../../common/schemas';
import { defineRoute, type RouteDef } from '../route';
import { InteractionParams, ListRunsQuery, RunList, RunParams, RunStarted } from '../schemas';

// Runs (SPEC section 5): start, read, list, answer, suspend, resume, cancel.

export function runRoutes(client: StasisClient): RouteDef[] {
  return [
    defineRoute({
      method: 'POST',
      path: '/api/v1/runs',
      summary: 'Start a Run from a RunSpec',
      body: RunSpec,
      status: 201,
      response: RunStarted,
      errors: ['INVALID_ARGUMENT', 'ALREADY_EXISTS'],
      handle: ({ body }) => client.runs.start(body),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/runs',
      summary: 'List Runs, newest first; `status=WAITING` gives the Runs waiting on a person',
      query: ListRunsQuery,
      status: 200,
      response: RunList,
      errors: ['INVALID_ARGUMENT'],
      handle: async ({ query }) => ({ runs: await client.runs.list(query) }),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/runs/{id}',
      summary: "A Run's user-visible snapshot",
      params: RunParams,
      status: 200,
      response: RunSnapshot,
      errors: ['NOT_FOUND'],
      handle: ({ params }) => client.runs.get(params.id),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/runs/{id}/resource',
      summary: "A Run's operator view: phase, resource record, suspension, children",
      params: RunParams,
      status: 200,
      response: ResourceView,
      errors: ['NOT_FOUND'],
      handle: ({ params }) => client.runs.resource(params.id),
    }),
    defineRoute({
      method: 'POST',
      path: '/api/v1/runs/{id}/interactions/{iid}',
      summary: 'Answer a pending interaction; the token name is recorded as respondedBy',
      params: InteractionParams,
      body: InteractionResponse,
      status: 200,
      response: InteractionRequest,
      errors: ['INVALID_ARGUMENT', 'NOT_FOUND', 'ALREADY_ANSWERED', 'STALE_SANDBOX_ROUTE', 'INVALID_STATE_TRANSITION'],
      handle: ({ params, body, caller }) => client.runs.respond(params.id, params.iid, body, { respondedBy: caller }),
    }),
    defineRoute({
      method: 'POST',
      path: '/api/v1/runs/{id}/suspend',
      summary: 'Suspend a Run by hand (MANUAL): its compute is released',
      params: RunParams,
      status: 200,
      response: RunSnapshot,
      errors: ['NOT_FOUND', 'INVALID_STATE_TRANSITION', 'STALE_SANDBOX_ROUTE'],
      handle: ({ params }) => client.runs.suspend(params.id),
    }),
    defineRoute({
      method: 'POST',
      path: '/api/v1/runs/{id}/resume',
      summary: 'Resume a Run suspended by hand',
      params: RunParams,
      status: 200,
      response: RunSnapshot,
      errors: ['NOT_FOUND', 'INVALID_STATE_TRANSITION', 'STALE_SANDBOX_ROUTE'],
      handle: ({ params }) => client.runs.resume(params.id),
    }),
    defineRoute({
      method: 'POST',
      path: '/api/v1/runs/{id}/cancel',
      summary: 'Cancel a Run: its compute is released and its children cancelled',
      params: RunParams,
      status: 200,
      response: RunSnapshot,
      errors: ['NOT_FOUND', 'INVALID_STATE_TRANSITION'],
      handle: ({ params }) => client.runs.cancel(params.id),
    }),
  ];
}
