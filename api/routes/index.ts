import { openApiDocument } from '../openapi';
import type { RouteDef } from '../route';
import { actionRoutes } from './actions';
import { metaRoutes } from './meta';
import { metricsRoutes } from './metrics';
import { runRoutes } from './runs';
import { sandboxRoutes } from './sandboxes';

/** Every route of the API, in one table: the handlers, their roles and the OpenAPI document come from it. */
export function apiRoutes(): RouteDef[] {
  const routes: RouteDef[] = [...runRoutes(), ...actionRoutes(), ...sandboxRoutes(), ...metricsRoutes()];
  // The document describes itself too: it is made on first request, from the whole table.
  routes.push(...metaRoutes(() => openApiDocument(routes)));
  return routes;
}
