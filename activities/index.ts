import { withFailures } from './failures';
import { createProviderActivities, type ProviderActivityDeps } from './provider';
import { createSharedActivities, type SharedActivityDeps } from './shared';
import { createWebhookActivities, type WebhookActivityDeps } from './webhooks';

export type ActivityDeps = ProviderActivityDeps & SharedActivityDeps & WebhookActivityDeps;

/** Every activity of a worker; provider errors cross as typed, retry-aware failures. */
export function createActivities(deps: ActivityDeps) {
  return withFailures({
    ...createProviderActivities({ ...deps, webhooks: deps.webhook !== undefined }),
    ...createSharedActivities(deps),
    ...createWebhookActivities(deps),
  });
}

export type Activities = ReturnType<typeof createActivities>;
