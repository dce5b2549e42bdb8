import { STATUS_CODES, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import fastify, {
  type ConnectionError,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import type { DestinationStream, LevelWithSilent } from 'pino';
import type { StasisClient } from '../client';
import { ConfigError } from '../common/config';
import { StasisError } from '../common/errors';
import type { ApiToken } from '../common/roles';
import { parseJsonBytes } from '../common/utf8';
import { FILE_LIMIT_BYTES, JSON_INPUT_LIMIT_BYTES } from '../common/payload-limits';
import { registerWebPage } from '../web/assets';
import { bearerAuth, type Caller } from './auth';
import { clientFailure, httpFailure } from './errors';
import { PROMETHEUS_CONTENT_TYPE } from './prometheus';
import { refusal, type RouteDef } from './route';
import { apiRoutes } from './routes';
import { errorBody } from './schemas';

// The REST API (docs/SURFACES.md) and the approval page, on fastify.

export interface ApiLogOptions {
  level?: LevelWithSilent;
  /** Where log lines go; stdout by default. */
  destination?: DestinationStream;
}

export interface ApiOptions {
  client: StasisClient;
  /** STASIS_API_TOKENS: each request acts as the token that signed it, within its role. */
  tokens: readonly ApiToken[];
  /** false: no logging. */
  logger?: ApiLogOptions | false;
}

/** Largest JSON request body. */
export const JSON_BODY_LIMIT = JSON_INPUT_LIMIT_BYTES;

declare module 'fastify' {
  interface FastifyRequest {
    /** The API token that signed the request. */
    caller?: Caller;
  }
  interface FastifyContextConfig {
    /** Served without a token: the page's files and /metrics. */
    public?: boolean;
    /** The route of the table this handler serves, for its role. */
    route?: RouteDef;
  }
}

const API_PATH = /^\/api(\/|\?|$)/;

/** On every answer of the server: not kept by any cache, and never sniffed as another content type. */
export const NO_STORE_HEADERS = { 'cache-control': 'no-store', 'x-content-type-options': 'nosniff' } as const;

/**
 * A `?token=` sign-in link must not end up in a log line. The page reads the link with
 * URLSearchParams, which percent-decodes names (`?%74oken=` signs in too), so each
 * parameter is judged by its name decoded the same way.
 */
export function redactUrl(url: string): string {
  const at = url.indexOf('?');
  if (at < 0) return url;
  const params = url
    .slice(at + 1)
    .split('&')
    .map((param) => (isTokenParam(param) ? `${param.split('=')[0]}=[redacted]` : param));
  return `${url.slice(0, at + 1)}${params.join('&')}`;
}

/** True when one `name=value` of a query is the sign-in token (any case: redacting more is harmless). */
const isTokenParam = (param: string): boolean =>
  [...new URLSearchParams(param).keys()].some((name) => name.toLowerCase() === 'token');

function loggerOptions(options: ApiLogOptions | false | undefined) {
  if (options === false) return false;
  return {
    level: options?.level ?? 'info',
    ...(options?.destination ? { stream: options.destination } : {}),
    redact: { paths: ['req.headers.authorization', 'req.headers.cookie'], censor: '[redacted]' },
    serializers: {
      req: (req: FastifyRequest) => ({ method: req.method, url: redactUrl(req.url), remoteAddress: req.ip }),
    },
  };
}

/**
 * Longest path parameter the router matches. Above an Identifier's 128
 * characters, so every valid id reaches its route; a longer one is a 400.
 */
const MAX_PARAM_LENGTH = 512;

export function buildApi(options: ApiOptions): FastifyInstance {
  const authenticate = bearerAuth(options.tokens);
  const app = fastify({
    logger: loggerOptions(options.logger),
    bodyLimit: JSON_BODY_LIMIT,
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // A URL the router cannot take (bad percent-encoding, an over-long parameter) is answered
    // before any route or hook: keep the contract there too (401 without a token under /api, else 400).
    frameworkErrors: (err, request, reply) => {
      const refusal =
        API_PATH.test(request.url) && authenticate(request.headers.authorization) === undefined
          ? new StasisError('UNAUTHORIZED', 'a valid "Authorization: Bearer <token>" header is required')
          : frameworkRefusal(err);
      // Answered before any hook runs: the onSend hook's headers are set here.
      void (reply as FastifyReply).code(refusal.httpStatus).headers(NO_STORE_HEADERS).send(errorBody(refusal));
    },
    // What Node's HTTP parser refuses (a control character in a header, headers too large)
    // never becomes a request: answer it on the socket, in the contract's shape too.
    clientErrorHandler: answerClientError,
  });
  const routes = apiRoutes();

  app.decorateRequest('caller', undefined);
  // Every route needs a token unless it is marked public; so does a miss under /api.
  // Then the token's role, before the body is read.
  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.config.public || (request.is404 && !API_PATH.test(request.url))) return;
    const caller = authenticate(request.headers.authorization);
    const route = request.routeOptions.config.route;
    const refused =
      caller === undefined
        ? new StasisError('UNAUTHORIZED', 'a valid "Authorization: Bearer <token>" header is required')
        : route && refusal(route, caller);
    if (refused) return reply.code(refused.httpStatus).send(errorBody(refused));
    request.caller = caller;
  });
  // fastify's query parser keeps what it cannot percent-decode as written ('%ZZ', the bytes of a lone
  // surrogate), so a file route would act on another name than the one sent: refuse such a query.
  app.addHook('onRequest', async (request, reply) => {
    const at = request.url.indexOf('?');
    if (at < 0 || wellEncoded(request.url.slice(at + 1))) return;
    const bad = new StasisError('INVALID_ARGUMENT', 'query: not valid percent-encoded UTF-8');
    return reply.code(bad.httpStatus).send(errorBody(bad));
  });
  // Each caller acts through its own Temporal identity, so Temporal Web shows who did what.
  const clientOf = (caller: Caller | undefined) =>
    caller ? options.client.withIdentity(`${API_IDENTITY_PREFIX}${caller.name}`) : options.client;

  // As bytes: a body that is not UTF-8 is refused, where a string parser would have turned its bad
  // bytes into U+FFFD and recorded or run that instead. Then the JSON rules every surface shares
  // (parseJsonText: one key once per object, well-formed Unicode, bounded nesting, no `__proto__`),
  // each refusal naming where it is. fastify's own parser refused `__proto__` as "not valid JSON".
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_request, bytes, done) => {
    // Bodyless POSTs (suspend, cancel, ...) may still say `Content-Type: application/json`.
    if ((bytes as Buffer).length === 0) return done(null, undefined);
    const parsed = parseJsonBytes(bytes as Buffer, 'body');
    if (parsed.problem !== undefined) return done(new StasisError('INVALID_ARGUMENT', parsed.problem), undefined);
    done(null, parsed.value);
  });

  // Every answer (errors included) holds a caller's data: no cache may keep it, and no browser
  // may take it for another type than it says (the page's own files say the same, web/assets.ts).
  app.addHook('onSend', async (_request, reply) => {
    void reply.headers(NO_STORE_HEADERS);
  });

  app.setErrorHandler((err, request, reply) => {
    const failure = httpFailure(err, request.routeOptions.bodyLimit ?? JSON_BODY_LIMIT);
    if (failure.httpStatus >= 500) request.log.error({ err }, 'request failed');
    return reply.code(failure.httpStatus).send(errorBody(failure));
  });
  app.setNotFoundHandler((request, reply) => {
    const missing = new StasisError('NOT_FOUND', `no route ${request.method} ${request.url.split('?')[0]}`);
    return reply.code(missing.httpStatus).send(errorBody(missing));
  });

  for (const route of routes.filter((r) => r.body !== 'bytes')) register(app, route, clientOf);
  // File content is raw bytes of any content type, up to the file limit.
  void app.register(async (files) => {
    files.removeAllContentTypeParsers();
    files.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: FILE_LIMIT_BYTES }, (_request, body, done) =>
      done(null, body),
    );
    for (const route of routes.filter((r) => r.body === 'bytes')) register(files, route, clientOf);
  });
  registerWebPage(app);
  // Node hands a CONNECT request to 'connect' listeners, and without one closes the socket unanswered.
  // No route tunnels: answer it as any other method no route takes (401 under /api without a token).
  app.server.on('connect', (request: IncomingMessage, socket: Socket) => {
    // The socket is ours now: a peer that resets it must not become an uncaught error.
    socket.on('error', () => socket.destroy());
    const url = request.url ?? '';
    const failure =
      API_PATH.test(url) && authenticate(request.headers.authorization) === undefined
        ? new StasisError('UNAUTHORIZED', 'a valid "Authorization: Bearer <token>" header is required')
        : new StasisError('NOT_FOUND', `no route CONNECT ${url.split('?')[0]}`);
    socket.end(rawAnswer(failure));
  });
  return app;
}

/** `failure` as a whole HTTP/1.1 answer in the contract's shape (no-store), for a socket no reply object has. */
function rawAnswer(failure: StasisError): string {
  const body = JSON.stringify(errorBody(failure));
  return (
    `HTTP/1.1 ${failure.httpStatus} ${STATUS_CODES[failure.httpStatus]}\r\n` +
    `Content-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
    `Cache-Control: ${NO_STORE_HEADERS['cache-control']}\r\nX-Content-Type-Options: ${NO_STORE_HEADERS['x-content-type-options']}\r\n` +
    `Connection: close\r\n\r\n${body}`
  );
}

/** Answers a request the HTTP parser refused, then closes the connection (its bytes cannot be trusted). */
function answerClientError(err: ConnectionError, socket: Socket): void {
  // A reset connection has no one to answer.
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  if (socket.writable) socket.write(rawAnswer(clientFailure(err)));
  socket.destroy(err);
}

/** True when every part of a query string percent-decodes to well-formed UTF-8. */
function wellEncoded(query: string): boolean {
  try {
    for (const part of query.split('&')) decodeURIComponent(part.replace(/\+/g, ' '));
    return true;
  } catch {
    return false;
  }
}

/** What the router refuses before routing, in the contract's terms. */
function frameworkRefusal(err: FastifyError): StasisError {
  if (err.code === 'FST_ERR_BAD_URL') return new StasisError('INVALID_ARGUMENT', 'params: not a valid URL component');
  if (err.code === 'FST_ERR_MAX_PARAM_LENGTH') {
    return new StasisError('INVALID_ARGUMENT', `params: longer than ${MAX_PARAM_LENGTH} characters`);
  }
  return httpFailure(err, JSON_BODY_LIMIT);
}

/** The Temporal client identity of what a token does through the API: this prefix and the token's name. */
export const API_IDENTITY_PREFIX = 'stasis-api:';

function register(app: FastifyInstance, route: RouteDef, clientOf: (caller: Caller | undefined) => StasisClient): void {
  app.route({
    method: route.method,
    url: route.path.replace(/\{(\w+)\}/g, ':$1'),
    config: { public: route.public, route },
    ...(route.body === 'bytes' ? { bodyLimit: FILE_LIMIT_BYTES } : {}),
    handler: async (request, reply) => {
      const result = await route.run({
        params: request.params,
        query: request.query,
        body: request.body,
        caller: request.caller,
        client: clientOf(request.caller),
      });
      reply.code(route.accepted?.when(result) ? 202 : route.status);
      if (route.response === 'none') return reply.send();
      if (route.response === 'bytes') return reply.type('application/octet-stream').send(result);
      if (route.response === 'text') return reply.type(PROMETHEUS_CONTENT_TYPE).send(result);
      return reply.send(result);
    },
  });
}

/** Parses STASIS_HTTP_ADDR (`host:port`) and listens; resolves with the base URL. */
export async function startApi(options: ApiOptions & { addr: string }): Promise<{ app: FastifyInstance; url: string }> {
  const app = buildApi(options);
  const at = options.addr.lastIndexOf(':');
  try {
    await app.listen({ host: options.addr.slice(0, at), port: Number(options.addr.slice(at + 1)) });
  } catch (err) {
    await app.close();
    throw new ConfigError([`STASIS_HTTP_ADDR: cannot listen on ${options.addr} (${(err as Error).message})`]);
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : Number(options.addr.slice(at + 1));
  return { app, url: `http://${options.addr.slice(0, at)}:${port}` };
}
