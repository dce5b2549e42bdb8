import type { Me } from '../api/schemas';
import { isErrorCode, StasisError } from '../common/errors';
import type {
  ActionView,
  ExecResult,
  InteractionRequest,
  RunSnapshot,
  SandboxPage,
  SandboxView,
} from '../common/schemas';

// The REST API as the MCP server uses it: every call carries the server's one
// token, so the API decides what the agent may do and records who did it.

export interface ApiClientOptions {
  /** STASIS_API_URL: the API's base URL, e.g. http://127.0.0.1:8080. */
  url: string;
  /** STASIS_API_TOKEN: a secret of STASIS_API_TOKENS. */
  token: string;
}

/** The REST operations behind the MCP tools. Refusals are StasisErrors with the API's code. */
export class ApiClient {
  private readonly base: string;

  constructor(private readonly options: ApiClientOptions) {
    this.base = options.url.replace(/\/+$/, '');
  }

  me = () => this.call<Me>('GET', '/api/v1/me');

  runs = {
    start: (spec: unknown) => this.call<{ runId: string }>('POST', '/api/v1/runs', spec),
    get: (runId: string) => this.call<RunSnapshot>('GET', `/api/v1/runs/${enc(runId)}`),
    respond: (runId: string, interactionId: string, response: unknown) =>
      this.call<InteractionRequest>('POST', `/api/v1/runs/${enc(runId)}/interactions/${enc(interactionId)}`, response),
    act: (runId: string, request: unknown, waitMs?: number) =>
      this.call<ActionView>(
        'POST',
        `/api/v1/runs/${enc(runId)}/actions${waitMs !== undefined ? `?waitMs=${waitMs}` : ''}`,
        request,
      ),
    action: (runId: string, actionId: string) =>
      this.call<ActionView>('GET', `/api/v1/runs/${enc(runId)}/actions/${enc(actionId)}`),
  };

  sandboxes = {
    create: (input: unknown) => this.call<SandboxView>('POST', '/api/v1/sandboxes', input),
    change: (sandboxId: string, op: 'start' | 'suspend' | 'resume') =>
      this.call<SandboxView>('POST', `/api/v1/sandboxes/${enc(sandboxId)}/${op}`),
    exec: (sandboxId: string, input: unknown) =>
      this.call<ExecResult>('POST', `/api/v1/sandboxes/${enc(sandboxId)}/exec`, input),
    destroy: (sandboxId: string) => this.call<SandboxView>('DELETE', `/api/v1/sandboxes/${enc(sandboxId)}`),
    list: (filter: { state?: string; label?: string[]; pageSize?: number; nextPageToken?: string }) => {
      const query = new URLSearchParams();
      if (filter.state !== undefined) query.set('state', filter.state);
      for (const label of filter.label ?? []) query.append('label', label);
      if (filter.pageSize !== undefined) query.set('pageSize', String(filter.pageSize));
      if (filter.nextPageToken !== undefined) query.set('nextPageToken', filter.nextPageToken);
      return this.call<SandboxPage>('GET', `/api/v1/sandboxes${query.size > 0 ? `?${query}` : ''}`);
    },
  };

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    let response: Response;
    try {
      response = await fetch(`${this.base}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${this.options.token}`,
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
      });
    } catch (err) {
      throw sendFailure(err, this.base);
    }
    const text = await response.text();
    let json: unknown;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    if (response.ok) return json as T;
    const error = (json as { error?: { code?: unknown; message?: unknown } } | undefined)?.error;
    const code = isErrorCode(error?.code) ? error.code : response.status >= 500 ? 'UNAVAILABLE' : 'INVALID_ARGUMENT';
    throw new StasisError(code, typeof error?.message === 'string' ? error.message : `HTTP ${response.status}`);
  }
}

const enc = encodeURIComponent;

/**
 * Why fetch threw. It says "fetch failed" (with the network error as cause) when the request
 * went out and no answer came: the API is unreachable, and a retry may get through. Any other
 * throw is a request that could not be built (a header value fetch cannot carry, a bad URL),
 * which no retry fixes: not "unreachable".
 */
function sendFailure(err: unknown, base: string): StasisError {
  // Read by shape: fetch's errors may come from another realm (a test VM), where instanceof fails.
  const message = messageOf(err);
  if (message === 'fetch failed') {
    const cause = messageOf((err as { cause?: unknown }).cause);
    return new StasisError('UNAVAILABLE', `the Stasis API at ${base} is not reachable (${cause})`);
  }
  return new StasisError('INTERNAL', `no request could be made to the Stasis API at ${base} (${message})`);
}

const messageOf = (err: unknown): string =>
  typeof (err as { message?: unknown } | undefined)?.message === 'string'
    ? (err as { message: string }).message
    : String(err);
