import { activeWorkspacesOfRun } from '../../common/host-paths';
import { ActionRequest, ActionView } from '../../common/schemas';
import { defineRoute, type RouteDef } from '../route';
import { ActionParams, ActionWaitQuery, RunParams } from '../schemas';

// External agents: send a Run its next action, read an action's outcome.

const underWay = (result: unknown): boolean => {
  const status = (result as ActionView).status;
  return status === 'running' || status === 'waiting';
};

export function actionRoutes(): RouteDef[] {
  return [
    defineRoute({
      method: 'POST',
      path: '/api/v1/runs/{id}/actions',
      summary:
        "Send an external agent's next action {actionId, action}; 200 with its outcome when it finishes within waitMs (default 20000, at most 60000), the same actionId again returns the same outcome",
      params: RunParams,
      query: ActionWaitQuery,
      body: ActionRequest,
      status: 200,
      response: ActionView,
      accepted: {
        when: underWay,
        summary:
          'The action is still under way (or an ask waits for a person): poll GET /api/v1/runs/{id}/actions/{actionId}',
      },
      errors: [
        'INVALID_ARGUMENT',
        'NOT_FOUND',
        'INVALID_STATE_TRANSITION',
        'IDEMPOTENCY_CONFLICT',
        'STALE_SANDBOX_ROUTE',
      ],
      role: 'operator',
      adminField: (body) =>
        body.action.type === 'spawn' ? activeWorkspacesOfRun(body.action.spec, 'action.spec.')[0]?.field : undefined,
      handle: ({ params, query, body, client }) =>
        client.runs.act(params.id, body, {
          inputName: 'body',
          ...(query.waitMs !== undefined ? { waitMs: query.waitMs } : {}),
        }),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/runs/{id}/actions/{actionId}',
      summary: "One of an external agent's actions: its status, and its result or error once finished",
      params: ActionParams,
      status: 200,
      response: ActionView,
      errors: ['NOT_FOUND'],
      role: 'operator',
      handle: ({ params, client }) => client.runs.action(params.id, params.actionId),
    }),
  ];
}
