import { log, proxyActivities, workflowInfo } from '@temporalio/workflow';
import { nonRetryableErrorTypes } from '../common/errors';
import type { Activities } from '../activities';
import type { InteractionRequest } from '../common/schemas';
import type { WebhookDelivery, WebhookEvent } from '../common/webhooks';
import { nowIso } from './clock';
import { failureMessage } from './failures';
import type { RunController } from './run-controller';

// Webhook notifications of a Run. Each is its own activity, started and not
// awaited on the Run's path, retried with backoff until the receiver takes it;
// the Run waits for the ones still out only once its own work is done (before it
// closes or continues as new), so a receiver that is down never slows it.

/** Runs recorded before webhooks start no delivery activity. */
export const PATCH_WEBHOOKS = 'stasis-run-webhooks';
/**
 * A Run whose sandbox was provisioned by a worker without a webhook starts no delivery: before, its
 * first delivery (at its first ask) was an activity that learnt so, and the workflow task of its
 * completion held up the one that recorded the suspension's release (BENCHMARKS.md, figure 1).
 */
export const PATCH_WEBHOOKS_KNOWN = 'stasis-run-webhooks-known';

const deliveries = proxyActivities<Activities>({
  startToCloseTimeout: '30s',
  // At least once within a week; after that the delivery is given up (and logged).
  scheduleToCloseTimeout: '7d',
  retry: {
    initialInterval: '1s',
    backoffCoefficient: 2,
    maximumInterval: '1m',
    nonRetryableErrorTypes: nonRetryableErrorTypes(),
  },
});

/** Starts the delivery of `event`; returns at once. */
export function notify(c: RunController, event: WebhookEvent, interaction?: InteractionRequest): void {
  if (c.webhooksOff || !c.patched(PATCH_WEBHOOKS)) return;
  if (c.sandbox.webhooks === false && c.patched(PATCH_WEBHOOKS_KNOWN)) {
    c.webhooksOff = true;
    return;
  }
  const run = c.run;
  run.webhookCount = (run.webhookCount ?? 0) + 1;
  const delivery: WebhookDelivery = {
    // Stable across retries and continue-as-new, unique across Runs that reuse an id.
    deliveryId: `${workflowInfo().firstExecutionRunId}-${run.webhookCount}`,
    event,
    occurredAt: nowIso(),
    runId: run.runId,
    status: run.status,
    ...(run.spec.labels && Object.keys(run.spec.labels).length > 0 ? { labels: run.spec.labels } : {}),
    ...(interaction ? { interaction: { ...interaction } } : {}),
    ...(event === 'run.ended' && run.error ? { error: run.error } : {}),
  };
  const sent: Promise<void> = deliveries.deliverWebhook(delivery).then(
    ({ configured }) => {
      // No webhook on this worker: the Run starts no more deliveries.
      if (!configured) c.webhooksOff = true;
    },
    (err: unknown) =>
      log.warn('webhook delivery given up', { deliveryId: delivery.deliveryId, error: failureMessage(err) }),
  );
  c.webhookDeliveries.add(sent);
  void sent.then(() => c.webhookDeliveries.delete(sent));
}

/** The Run ended: its expired interactions, then the end itself. */
export function notifyEnded(c: RunController): void {
  for (const i of c.run.interactions) if (i.status === 'expired') notify(c, 'interaction.expired', i);
  notify(c, 'run.ended');
}

/** Waits for the deliveries still out (before the workflow closes or continues as new). */
export async function drainWebhooks(c: RunController): Promise<void> {
  while (c.webhookDeliveries.size > 0) await Promise.all([...c.webhookDeliveries]);
}
