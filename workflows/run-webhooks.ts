import { log, ParentClosePolicy, startChild, workflowInfo } from '@temporalio/workflow';
import type { InteractionRequest } from '../common/schemas';
import type { WebhookDelivery, WebhookEvent } from '../common/webhooks';
import { nowIso } from './clock';
import { failureMessage } from './failures';
import type { RunController } from './run-controller';
import { forgetContent, INTERACTION_PAYLOAD_MAX_BYTES } from './run-state';
import { deliveries, webhookDeliveryId, webhookDeliveryWorkflow } from './webhook-delivery';
import { jsonBytes } from '../common/payload-limits';

// Webhook notifications of a Run. Each is a workflow of its own (webhook-delivery.ts),
// started and not awaited on the Run's path, retrying with backoff until the receiver
// takes it; the Run waits only for their starts before it continues as new, and for
// the deliveries once it has ended, so a receiver that is down never slows it. (Runs before PATCH_WEBHOOK_WORKFLOWS ran
// each delivery as an activity of their own and waited for it at those points.)

/** Runs recorded before webhooks start no delivery activity. */
export const PATCH_WEBHOOKS = 'stasis-run-webhooks';
/**
 * A Run whose sandbox was provisioned by a worker without a webhook starts no delivery: before, its
 * first delivery (at its first ask) was an activity that learnt so, and the workflow task of its
 * completion held up the one that recorded the suspension's release (BENCHMARKS.md, figure 1).
 */
export const PATCH_WEBHOOKS_KNOWN = 'stasis-run-webhooks-known';
/**
 * Each delivery is a workflow of its own (webhook-delivery.ts) the Run only starts: before, an activity
 * of the Run's, which the Run waited for before continuing as new, so a receiver that was down held a
 * Run that had to continue as new where it was (compute held, no next step) for up to a week.
 */
export const PATCH_WEBHOOK_WORKFLOWS = 'stasis-run-webhook-workflows';

/**
 * A delivery's input is kept within INTERACTION_PAYLOAD_MAX_BYTES: past it, without the Run's labels and
 * the interaction's bulk (forgetContent), `truncated: true`. Before, labels, a reviewed command and an
 * answer of 700 KB each made an input Temporal refused (BadStartChildExecutionAttributes), and it
 * terminated the Run. Asked only when the input is over the bound.
 */
export const PATCH_WEBHOOK_INPUT_FITS = 'stasis-run-webhook-input-fits';

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
  // Past the bound (labels, a reviewed action and an answer may each be up to a megabyte), the
  // delivery goes without the labels and the interaction's bulk, marked: Temporal refuses a larger input.
  if (jsonBytes(delivery) > INTERACTION_PAYLOAD_MAX_BYTES && c.patched(PATCH_WEBHOOK_INPUT_FITS)) {
    delete delivery.labels;
    if (delivery.interaction) delivery.interaction = forgetContent(delivery.interaction);
    delivery.truncated = true;
  }
  if (c.patched(PATCH_WEBHOOK_WORKFLOWS)) {
    const child = startChild(webhookDeliveryWorkflow, {
      workflowId: webhookDeliveryId(delivery.deliveryId),
      args: [delivery],
      parentClosePolicy: ParentClosePolicy.ABANDON,
    });
    const started = child.then(
      () => undefined,
      (err: unknown) =>
        log.warn('webhook delivery not started', { deliveryId: delivery.deliveryId, error: failureMessage(err) }),
    );
    track(c.webhookStarts, started);
    track(
      c.webhookDeliveries,
      child.then((handle) => handle.result()).catch(() => undefined),
    );
    return;
  }
  const sent: Promise<void> = deliveries.deliverWebhook(delivery).then(
    ({ configured }) => {
      // No webhook on this worker: the Run starts no more deliveries.
      if (!configured) c.webhooksOff = true;
    },
    (err: unknown) =>
      log.warn('webhook delivery given up', { deliveryId: delivery.deliveryId, error: failureMessage(err) }),
  );
  track(c.webhookDeliveries, sent);
}

/** Keeps `promise` in `set` until it settles. */
function track(set: Set<Promise<void>>, promise: Promise<void>): void {
  set.add(promise);
  void promise.then(() => set.delete(promise));
}

/** The Run ended: its expired interactions, then the end itself. */
export function notifyEnded(c: RunController): void {
  for (const i of c.run.interactions) if (i.status === 'expired') notify(c, 'interaction.expired', i);
  notify(c, 'run.ended');
}

/**
 * Waits for the deliveries still out before the workflow closes (and, for Runs before
 * PATCH_WEBHOOK_WORKFLOWS, before it continues as new; since, continue-as-new waits only for
 * c.webhookStarts).
 */
export async function drainWebhooks(c: RunController): Promise<void> {
  while (c.webhookDeliveries.size > 0) await Promise.all([...c.webhookDeliveries]);
}
