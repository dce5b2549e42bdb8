import { MetricsSnapshot } from '../../common/schemas';
import { prometheusText } from '../prometheus';
import { defineRoute, type RouteDef } from '../route';

// Diagnostics: the snapshot as JSON, and as Prometheus text for scrapers.

export function metricsRoutes(): RouteDef[] {
  return [
    defineRoute({
      method: 'GET',
      path: '/api/v1/metrics',
      summary: 'The metrics snapshot',
      status: 200,
      response: MetricsSnapshot,
      errors: [],
      role: 'operator',
      handle: ({ client }) => client.metricsSnapshot(),
    }),
    defineRoute({
      method: 'GET',
      path: '/metrics',
      summary: 'The metrics snapshot in Prometheus text format (no token: for scrapers)',
      status: 200,
      response: 'text',
      errors: [],
      role: 'public',
      handle: async ({ client }) => prometheusText(await client.metricsSnapshot()),
    }),
  ];
}
