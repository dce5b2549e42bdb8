// A small fetch wrapper for the API tests: status, headers, and the body as
// JSON (when it is JSON) or bytes.

export interface HttpResult {
  status: number;
  headers: Headers;
  json: unknown;
  bytes: Buffer;
}

export interface CallOptions {
  token?: string;
  /** JSON-encoded unless `raw` is given. */
  body?: unknown;
  raw?: Buffer | string;
  contentType?: string;
  headers?: Record<string, string>;
}

export function httpClient(base: string) {
  return async (method: string, path: string, options: CallOptions = {}): Promise<HttpResult> => {
    const headers: Record<string, string> = { ...options.headers };
    if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
    let body: Buffer | string | undefined = options.raw;
    if (options.body !== undefined) body = JSON.stringify(options.body);
    if (body !== undefined)
      headers['content-type'] =
        options.contentType ?? (options.raw === undefined ? 'application/json' : 'application/octet-stream');
    const response = await fetch(`${base}${path}`, { method, headers, body });
    const bytes = Buffer.from(await response.arrayBuffer());
    let json: unknown;
    if ((response.headers.get('content-type') ?? '').includes('application/json'))
      json = JSON.parse(bytes.toString('utf8'));
    return { status: response.status, headers: response.headers, json, bytes };
  };
}

/** `{error: {code}}` of a response, for short assertions. */
export const errorCode = (result: HttpResult): string | undefined =>
  (result.json as { error?: { code?: string } } | undefined)?.error?.code;
export const errorMessage = (result: HttpResult): string =>
  (result.json as { error?: { message?: string } } | undefined)?.error?.message ?? '';

/** Listens on a free loopback port and returns a caller for it. */
export async function listenOnLoopback(app: {
  listen(o: { host: string; port: number }): Promise<unknown>;
  server: { address(): unknown };
}): Promise<ReturnType<typeof httpClient>> {
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address() as { port?: number } | null;
  return httpClient(`http://127.0.0.1:${address?.port ?? 0}`);
}
