import { z } from 'zod';
import { defineRoute, type RouteDef } from '../route';
import { Me } from '../schemas';

// About the API itself: its OpenAPI document, and who the caller is (the MCP
// server and the page ask, to offer only what the token may do).

export function metaRoutes(document: () => Record<string, unknown>): RouteDef[] {
  let cached: Record<string, unknown> | undefined;
  return [
    defineRoute({
      method: 'GET',
      path: '/api/openapi.json',
      summary: 'This OpenAPI document',
      status: 200,
      response: z.record(z.string(), z.unknown()),
      errors: [],
      role: 'approver',
      handle: async () => (cached ??= document()),
    }),
    defineRoute({
      method: 'GET',
      path: '/api/v1/me',
      summary: "The calling token's name and role",
      status: 200,
      response: Me,
      errors: [],
      role: 'approver',
      handle: async ({ caller }) => caller,
    }),
  ];
}
