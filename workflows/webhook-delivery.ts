import { log, proxyActivities } from '@temporalio/workflow';
import { nonRetryableErrorTypes } from '../common/errors';
import type { Activities } from '../activities';
import type { WebhookDelivery } from '../common/webhooks';
import { failureMessage } from './failures';
import { WEBHOOK_WORKFLOW_PREFIX } from '../common/wire-checks';

// One webhook delivery as a workflow of its own, started by a Run and left to run (ABANDON): it retries
// until the receiver takes it, and the Run waits only for it to start, never for the receiver, so a
// receiver that is down holds up neither the Run's continue-as-new nor its close.

/** The delivery activity: at least once within a week; after that it is given up (and logged). */
export const deliveries = proxyActivities<Activities>({
  startToCloseTimeout: '30s',
  scheduleToCloseTimeout: '7d',
  retry: {
    initialInterval: '1s',
    backoffCoefficient: 2,
    maximumInterval: '1m',
    nonRetryableErrorTypes: nonRetryableErrorTypes(),
  },
});

/** The workflow id of a delivery: its deliveryId is unique across Runs and continue-as-new. */
export const webhookDeliveryId = (deliveryId: string): string => `${WEBHOOK_WORKFLOW_PREFIX}${deliveryId}`;

/** Delivers `delivery` (the Run that started it may have closed or continued as new meanwhile). */
export async function webhookDeliveryWorkflow(delivery: WebhookDelivery): Promise<void> {
  await deliveries.deliverWebhook(delivery).catch((err: unknown) => {
    log.warn('webhook delivery given up', { deliveryId: delivery.deliveryId, error: failureMessage(err) });
  });
}
