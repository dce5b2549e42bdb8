import { z } from 'zod';
import type { StasisClient } from '../client';
import { StasisError, type ErrorCode } from '../common/errors';
import { allows, mayAnswer, type Role } from '../common/roles';
import type { Caller } from './auth';
import { parseInput } from './validate';

// One table of routes drives both the fastify handlers and the OpenAPI
// document, so the document is generated from the very schemas that validate.

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';
/** `bytes`: raw file content (application/octet-stream); `text`: Prometheus exposition; `none`: 204. */
export type Payload = z.ZodType | 'bytes' | 'text' | 'none';

/** What a handler gets, parsed: `caller` is the token that signed the request, `client` acts as it. */
export interface RouteInput<P, Q, B> {
  params: P;
  query: Q;
  body: B;
  caller: Caller;
  client: StasisClient;
}

/** What the server hands a route: the raw request parts, who signed it (absent on a public route) and its client. */
export interface RawInput {
  params: unknown;
  query: unknown;
  body: unknown;
  caller?: Caller;
  client: StasisClient;
}

type BodyOf<B> = B extends z.ZodType ? z.infer<B> : Buffer;
type Empty = z.ZodObject<Record<string, never>>;

export interface RouteSpec<P extends z.ZodObject, Q extends z.ZodObject, B extends z.ZodType | 'bytes'> {
  method: Method;
  /** OpenAPI style: `{id}` marks a path parameter. */
  path: string;
  summary: string;
  params?: P;
  query?: Q;
  body?: B;
  status: number;
  response: Payload;
  /** Answered with 202 (and the same payload) instead of `status` when the work goes on after the answer. */
  accepted?: { when: (result: unknown) => boolean; summary: string };
  /** The error codes this route answers with, for the document (401 and 403 are added for every /api route). */
  errors: ErrorCode[];
  /** The least role that may call it; `public`: outside `/api`, served without a token. */
  role: Role | 'public';
  /** The field of a request that needs `admin` (an active workspace on a host path), if any. */
  adminField?: (body: BodyOf<B>) => string | undefined;
  /** It answers an interaction, which an `agent` token may not (see mayAnswer). */
  answers?: boolean;
  handle(input: RouteInput<z.infer<P>, z.infer<Q>, BodyOf<B>>): Promise<unknown>;
}

/** A route with its types erased, ready to register and to document. */
export interface RouteDef {
  method: Method;
  path: string;
  summary: string;
  params?: z.ZodObject;
  query?: z.ZodObject;
  body?: z.ZodType | 'bytes';
  status: number;
  response: Payload;
  accepted?: { when: (result: unknown) => boolean; summary: string };
  errors: ErrorCode[];
  public: boolean;
  /** The least role that may call it (absent on a public route). */
  role?: Role;
  /** It answers an interaction, which an `agent` token may not. */
  answers?: boolean;
  /** Parses, authorizes and handles a request. */
  run(raw: RawInput): Promise<unknown>;
}

/** The refusal of a request beyond the caller's role. */
function forbidden(caller: Caller, needed: Role, what: string): StasisError {
  return new StasisError('FORBIDDEN', `${what} needs the ${needed} role; token ${caller.name} is ${caller.role}`);
}

/**
 * The refusal of `caller` on `route` by the route's role, if any. The server asks
 * before the request's body is read, so a refused request changes nothing.
 */
export function refusal(
  route: Pick<RouteDef, 'method' | 'path' | 'role' | 'answers'>,
  caller: Caller,
): StasisError | undefined {
  if (route.answers && !mayAnswer(caller.role)) {
    return new StasisError(
      'FORBIDDEN',
      `${route.method} ${route.path} answers an interaction, which the ${caller.role} role may not; token ${caller.name} is ${caller.role}`,
    );
  }
  return route.role && !allows(caller.role, route.role)
    ? forbidden(caller, route.role, `${route.method} ${route.path}`)
    : undefined;
}

/** Path parameters are the router's (only those the path names); a body must not carry unknown fields. */
const NONE = z.object({});
const EMPTY: Empty = z.object({}).strict();

export function defineRoute<
  P extends z.ZodObject = Empty,
  Q extends z.ZodObject = Empty,
  B extends z.ZodType | 'bytes' = z.ZodOptional<Empty>,
>(spec: RouteSpec<P, Q, B>): RouteDef {
  // A query parameter the route does not name is refused (`query: Unrecognized key: "stauts"`), never
  // ignored: a misspelt filter listed everything, a misspelt `waitMs` waited the default.
  const query = (spec.query ?? EMPTY).strict();
  return {
    method: spec.method,
    path: spec.path,
    summary: spec.summary,
    params: spec.params,
    query: spec.query,
    // A route without a body accepts none (or `{}`), so a stray field is a 400, not silently ignored.
    body: spec.body ?? (spec.method === 'POST' ? EMPTY.optional() : undefined),
    status: spec.status,
    response: spec.response,
    ...(spec.accepted ? { accepted: spec.accepted } : {}),
    errors: spec.errors,
    public: spec.role === 'public',
    ...(spec.role === 'public' ? {} : { role: spec.role }),
    ...(spec.answers ? { answers: true } : {}),
    async run(raw) {
      const caller = raw.caller ?? { name: 'anonymous', role: 'approver' };
      // A PUT without content is an empty file.
      const bytes = Buffer.isBuffer(raw.body) ? raw.body : Buffer.alloc(0);
      const body = (
        spec.body === 'bytes' ? bytes : parseInput(spec.body ?? EMPTY.optional(), raw.body, 'body')
      ) as BodyOf<B>;
      const adminField = spec.adminField?.(body);
      if (adminField !== undefined && !allows(caller.role, 'admin'))
        throw forbidden(caller, 'admin', `body.${adminField}`);
      return spec.handle({
        params: parseInput(spec.params ?? NONE, raw.params ?? {}, 'params') as z.infer<P>,
        query: parseInput(query, raw.query ?? {}, 'query') as z.infer<Q>,
        body,
        caller,
        client: raw.client,
      });
    },
  };
}
