import { z } from 'zod';
import { ERROR_STATUS, type ErrorCode } from '../common/errors';
import * as wire from '../common/schemas';
import type { Payload, RouteDef } from './route';
import { ErrorBody, RunList, RunStarted } from './schemas';

// GET /api/openapi.json: an OpenAPI 3.1 document generated from the route table
// and the zod schemas that validate each request (z.toJSONSchema).

type Json = Record<string, unknown>;

/** Bodies are named components, so recursive ones (RunSpec, through spawn) resolve by $ref. */
const COMPONENTS: Record<string, z.ZodType> = {
  RunSpec: wire.RunSpec,
  RunStarted,
  RunList,
  RunSnapshot: wire.RunSnapshot,
  ResourceView: wire.ResourceView,
  InteractionResponse: wire.InteractionResponse,
  InteractionRequest: wire.InteractionRequest,
  CreateSandboxInput: wire.CreateSandboxInput,
  SandboxView: wire.SandboxView,
  SandboxPage: wire.SandboxPage,
  ExecInput: wire.ExecInput,
  ExecResult: wire.ExecResult,
  ActionRequest: wire.ActionRequest,
  ActionView: wire.ActionView,
  MetricsSnapshot: wire.MetricsSnapshot,
  Error: ErrorBody,
};

const ref = (id: string): Json => ({ $ref: `#/components/schemas/${id}` });
const OPTIONS = { io: 'input', unrepresentable: 'any' } as const;

function componentSchemas(): Json {
  const registry = z.registry<{ id: string }>();
  for (const [id, schema] of Object.entries(COMPONENTS)) registry.add(schema, { id });
  const { schemas } = z.toJSONSchema(registry, { ...OPTIONS, uri: (id) => ref(id).$ref as string });
  // Each component is a schema of this document, not a document of its own.
  return Object.fromEntries(Object.entries(schemas).map(([id, { $schema: _s, $id: _i, ...schema }]) => [id, schema]));
}

function schemaOf(schema: z.ZodType): Json {
  const id = Object.keys(COMPONENTS).find((key) => COMPONENTS[key] === schema);
  if (id) return ref(id);
  const { $schema: _s, ...json } = z.toJSONSchema(schema, OPTIONS);
  return json;
}

function content(payload: Payload): Json | undefined {
  if (payload === 'none') return undefined;
  if (payload === 'bytes')
    return { 'application/octet-stream': { schema: { type: 'string', contentMediaType: 'application/octet-stream' } } };
  if (payload === 'text') return { 'text/plain': { schema: { type: 'string' } } };
  return { 'application/json': { schema: schemaOf(payload) } };
}

const optional = (schema: z.ZodType): boolean => schema.safeParse(undefined).success;

function parameters(route: RouteDef): Json[] {
  const of = (where: 'path' | 'query', object: z.ZodObject | undefined) =>
    Object.entries(object?.shape ?? {}).map(([name, schema]) => ({
      name,
      in: where,
      required: where === 'path' || !optional(schema as z.ZodType),
      schema: schemaOf(schema as z.ZodType),
    }));
  return [...of('path', route.params), ...of('query', route.query)];
}

/** Codes sharing a status (409 has several) are listed together. */
function errorResponses(route: RouteDef): Json {
  const refusals: ErrorCode[] = route.public
    ? []
    : route.role === 'approver' && !route.answers
      ? ['UNAUTHORIZED']
      : ['UNAUTHORIZED', 'FORBIDDEN'];
  const codes = new Set<ErrorCode>([...route.errors, ...refusals, 'INTERNAL']);
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of codes) byStatus.set(ERROR_STATUS[code], [...(byStatus.get(ERROR_STATUS[code]) ?? []), code]);
  return Object.fromEntries(
    [...byStatus].map(([status, list]) => [
      String(status),
      { description: list.join(', '), content: content(ErrorBody) },
    ]),
  );
}

export function openApiDocument(routes: RouteDef[]): Json {
  const paths: Record<string, Record<string, Json>> = {};
  for (const route of routes) {
    const body = route.body === 'bytes' || (route.body && !optional(route.body)) ? route.body : undefined;
    paths[route.path] ??= {};
    paths[route.path][route.method.toLowerCase()] = {
      summary: route.summary,
      ...(route.public ? { security: [] } : { 'x-stasis-role': route.role }),
      parameters: parameters(route),
      ...(body ? { requestBody: { required: true, content: content(body) } } : {}),
      responses: {
        [String(route.status)]: { description: route.summary, content: content(route.response) },
        ...(route.accepted ? { '202': { description: route.accepted.summary, content: content(route.response) } } : {}),
        ...errorResponses(route),
      },
    };
  }
  return {
    openapi: '3.1.0',
    info: { title: 'Stasis API', version: '1' },
    components: {
      securitySchemes: {
        bearer: {
          type: 'http',
          scheme: 'bearer',
          description:
            'A secret of STASIS_API_TOKENS; x-stasis-role of each operation is the least role that may call it',
        },
      },
      schemas: componentSchemas(),
    },
    security: [{ bearer: [] }],
    paths,
  };
}
