import type { FastifyInstance } from 'fastify';
import { buildApi } from '../../api/server';
import type { ApiToken } from '../../common/roles';
import { startStack, type StackOptions, type TestStack } from '../helpers/stack';
import { listenOnLoopback, type CallOptions, type HttpResult } from './http';

type Call = (method: string, path: string, options?: CallOptions) => Promise<HttpResult>;

/**
 * A test stack and the REST API over it with `tokens`, listening on loopback: started before the
 * file's tests, closed after them. Its fields are set once `beforeAll` has run. `stackOptions` is read
 * in `beforeAll` (a webhook receiver's port is known only then).
 */
export function apiOnStack(tokens: readonly ApiToken[], stackOptions: () => StackOptions = () => ({})) {
  const api = {
    stack: undefined as unknown as TestStack,
    app: undefined as unknown as FastifyInstance,
    http: undefined as unknown as Call,
    /** Calls the API with `token`'s secret. */
    as:
      (token: { secret: string }): Call =>
      (method, path, options = {}) =>
        api.http(method, path, { token: token.secret, ...options }),
    /** The API's base address. */
    base: () => `http://127.0.0.1:${(api.app.server.address() as { port: number }).port}`,
  };
  beforeAll(async () => {
    api.stack = await startStack(stackOptions());
    api.app = buildApi({ client: api.stack.client, tokens, logger: false });
    api.http = await listenOnLoopback(api.app);
  });
  afterAll(async () => {
    await api.app?.close();
    await api.stack?.stop();
  });
  return api;
}
