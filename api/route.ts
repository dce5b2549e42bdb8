import { z } from 'zod';
import type { ErrorCode } from '../common/errors';
import { parseInput } from './validate';

// One table of routes drives both the fastify handlers and the OpenAPI
// document, so the document is generated from the very schemas that validate.

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';
/** `bytes`: raw file content (application/octet-stream); `text`: Prometheus exposition; `none`: 204. */
export type Payload = z.ZodType | 'bytes' | 'text' | 'none';

/** What a handler gets, parsed: `caller` is the name of the token that signed the request. */
export interface RouteInput<P, Q, B> {
  params: P;
  query: Q;
  body: B;
  caller: string;
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
  /** The error codes this route answers with, for the document. */
  errors: ErrorCode[];
  /** Outside `/api`: served without a token. */
  public?: boolean;
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
  errors: ErrorCode[];
  public: boolean;
  run(raw: RouteInput<unknown, unknown, unknown>): Promise<unknown>;
}

/** Params and query ignore what they do not name; a body must not carry unknown fields. */
const NONE = z.object({});
const EMPTY: Empty = z.object({}).strict();

export function defineRoute<
  P extends z.ZodObject = Empty,
  Q extends z.ZodObject = Empty,
  B extends z.ZodType | 'bytes' = z.ZodOptional<Empty>,
>(spec: RouteSpec<P, Q, B>): RouteDef {
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
    errors: spec.errors,
    public: spec.public ?? false,
    async run(raw) {
      // A PUT without content is an empty file.
      const bytes = Buffer.isBuffer(raw.body) ? raw.body : Buffer.alloc(0);
      const body = spec.body === 'bytes' ? bytes : parseInput(spec.body ?? EMPTY.optional(), raw.body, 'body');
      return spec.handle({
        params: parseInput(spec.params ?? NONE, raw.params ?? {}, 'params') as z.infer<P>,
        query: parseInput(spec.query ?? NONE, raw.query ?? {}, 'query') as z.infer<Q>,
        body: body as BodyOf<B>,
        caller: raw.caller,
      });
    },
  };
}
