import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { ApiClient } from '../../mcp/api-client';

// The MCP server's client of the REST API: "not reachable" (UNAVAILABLE, worth a retry)
// only when a request went out and no answer came, never for a request fetch could not build.

/** A server on a free port answering every request as the API answers a wrong token. */
async function listening(): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((_req, res) => {
    res.writeHead(401, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { code: 'UNAUTHORIZED', message: 'wrong token' } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

const failureOf = (api: ApiClient) =>
  api.me().then(
    () => undefined,
    (err: { code: string; message: string }) => err,
  );

test('a token fetch cannot put in a header is not reported as an unreachable API', async () => {
  const server = await listening();
  // The API is up: only the header (U+20AC is no byte) stops the request.
  const err = await failureOf(new ApiClient({ url: server.url, token: 'bad-token-€-0123456789' }));
  expect(err?.code).not.toBe('UNAVAILABLE');
  expect(err?.message).not.toMatch(/not reachable/);
  expect(err?.message).toMatch(/no request could be made/);
  // A token that can be sent reaches it.
  expect(await failureOf(new ApiClient({ url: server.url, token: 'good-token-0123456789' }))).toMatchObject({
    code: 'UNAUTHORIZED',
  });
  // Once it is gone, the API is unreachable.
  await server.close();
  expect(await failureOf(new ApiClient({ url: server.url, token: 'good-token-0123456789' }))).toMatchObject({
    code: 'UNAVAILABLE',
    message: expect.stringMatching(/not reachable/),
  });
});
