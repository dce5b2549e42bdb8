import { createHmac, timingSafeEqual } from 'node:crypto';
import type { InteractionRequest, RunError, RunStatus } from './schemas';

// Webhook notifications (README, "Approvals"; docs/SURFACES.md, Webhooks): what
// a delivery carries and how it is signed, so a receiver can check it came from
// Stasis. Workflows import the types only.

export const WEBHOOK_EVENTS = [
  'interaction.opened',
  'interaction.answered',
  'interaction.expired',
  'run.ended',
] as const;
export type WebhookEvent = (typeof WEBHOOK_EVENTS)[number];

/** What the Run hands the delivery activity; the activity adds the page link. */
export interface WebhookDelivery {
  /** The same on every retry of one delivery: a receiver drops a delivery id it has seen. */
  deliveryId: string;
  event: WebhookEvent;
  /** When it happened (workflow time), ISO 8601. */
  occurredAt: string;
  runId: string;
  /** The Run's status at the time. */
  status: RunStatus;
  labels?: Record<string, string>;
  interaction?: InteractionRequest;
  /** run.ended of a Run that did not complete. */
  error?: RunError;
  /**
   * The delivery was larger than a Run may send: it goes without `labels` and the interaction without
   * its bulk (`contentForgotten`); read the Run (GET /api/v1/runs/{runId}) for the rest.
   */
  truncated?: true;
}

/** The POSTed body: the delivery and, for an interaction, its deep link on the approval page. */
export interface WebhookPayload extends WebhookDelivery {
  link?: string;
}

/** Request headers of a delivery. */
export const WEBHOOK_HEADERS = {
  delivery: 'stasis-delivery',
  event: 'stasis-event',
  /** `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed with STASIS_WEBHOOK_SECRET>` */
  signature: 'stasis-signature',
} as const;

/** The signature header value of `body` sent at `timestamp` (unix seconds). */
export function signWebhook(secret: string, timestamp: number, body: string): string {
  const mac = createHmac('sha256', secret).update(`${timestamp}.${body}`).digest('hex');
  return `t=${timestamp},v1=${mac}`;
}

/**
 * Whether `header` signs `body` with `secret`, sent within `toleranceSeconds` of
 * `nowSeconds` (an old signature replayed later is refused). Compare in constant time.
 */
export function verifyWebhook(
  secret: string,
  header: string | undefined,
  body: string,
  options: { nowSeconds?: number; toleranceSeconds?: number } = {},
): boolean {
  const parts = Object.fromEntries((header ?? '').split(',').map((p) => p.split('=', 2) as [string, string]));
  const timestamp = Number(parts.t);
  if (!/^[0-9]+$/.test(parts.t ?? '') || !/^[0-9a-f]{64}$/.test(parts.v1 ?? '')) return false;
  const now = options.nowSeconds ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - timestamp) > (options.toleranceSeconds ?? 300)) return false;
  const expected = Buffer.from(signWebhook(secret, timestamp, body).split('v1=')[1], 'hex');
  return timingSafeEqual(expected, Buffer.from(parts.v1, 'hex'));
}
