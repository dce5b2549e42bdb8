import { ApplicationFailure } from '@temporalio/common';
import { signWebhook, WEBHOOK_HEADERS, type WebhookDelivery, type WebhookPayload } from '../common/webhooks';
import { withRunLabels } from '../common/interactions';

// The webhook delivery activity: one signed POST per call. Temporal retries it
// with backoff until the receiver takes it (a 2xx), so delivery is at least once.

/** Where deliveries go: STASIS_WEBHOOK_URL, STASIS_WEBHOOK_SECRET, and the page's address for links. */
export interface WebhookTarget {
  url: string;
  secret?: string;
  /** STASIS_PUBLIC_URL, or the API's own address. */
  publicUrl: string;
}

export interface WebhookActivityDeps {
  webhook?: WebhookTarget;
}

/** How long one attempt may take before it counts as failed (and is retried). */
const ATTEMPT_TIMEOUT_MS = 10_000;

export function createWebhookActivities(deps: WebhookActivityDeps) {
  return {
    /** Posts one delivery; `configured: false` when no webhook is set, so the Run sends no more. */
    async deliverWebhook(delivery: WebhookDelivery): Promise<{ configured: boolean }> {
      const target = deps.webhook;
      if (!target) return { configured: false };
      const payload: WebhookPayload = {
        ...delivery,
        // The Run sends its labels once; the interaction shows them as it did when it carried a copy.
        ...(delivery.interaction ? { interaction: withRunLabels(delivery.interaction, delivery.labels) } : {}),
        ...(delivery.interaction
          ? { link: interactionLink(target.publicUrl, delivery.runId, delivery.interaction.id) }
          : {}),
      };
      const body = JSON.stringify(payload);
      const headers: Record<string, string> = {
        'content-type': 'application/json',
        'user-agent': 'stasis-webhooks',
        [WEBHOOK_HEADERS.delivery]: delivery.deliveryId,
        [WEBHOOK_HEADERS.event]: delivery.event,
      };
      if (target.secret)
        headers[WEBHOOK_HEADERS.signature] = signWebhook(target.secret, Math.floor(Date.now() / 1000), body);
      let status: number;
      try {
        const response = await fetch(target.url, {
          method: 'POST',
          headers,
          body,
          redirect: 'manual',
          signal: AbortSignal.timeout(ATTEMPT_TIMEOUT_MS),
        });
        status = response.status;
        await response.body?.cancel();
      } catch (err) {
        throw ApplicationFailure.retryable(
          `webhook ${target.url} unreachable: ${(err as Error).message}`,
          'WEBHOOK_UNREACHABLE',
        );
      }
      if (status < 200 || status >= 300) {
        throw ApplicationFailure.retryable(`webhook ${target.url} answered ${status}`, 'WEBHOOK_REFUSED');
      }
      return { configured: true };
    },
  };
}

/** The interaction's deep link on the approval page. */
export function interactionLink(publicUrl: string, runId: string, interactionId: string): string {
  return `${publicUrl.replace(/\/+$/, '')}/#/runs/${encodeURIComponent(runId)}/interactions/${encodeURIComponent(interactionId)}`;
}
