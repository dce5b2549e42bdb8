import { z } from 'zod';
import { decodeCursor } from '../client/cursor';
import type { StasisError } from '../common/errors';
import { ROLES } from '../common/roles';
import {
  ActionWaitMs,
  Identifier,
  MAX_PAGE_SIZE,
  PendingInteraction,
  RunListLimit,
  RunSnapshot,
  RunStatus,
  SandboxState,
  WorkspacePath,
} from '../common/schemas';

// The REST API's own request and response shapes, built from the wire schemas.

export const RunParams = z.object({ id: Identifier });
export const InteractionParams = z.object({ id: Identifier, iid: Identifier });
export const SandboxParams = z.object({ id: Identifier });
export const ActionParams = z.object({ id: Identifier, actionId: Identifier });
// Queries are strict, like bodies: an unknown (misspelt) parameter is a 400 naming it, never ignored
// (defineRoute makes every route's query strict too).

/** How long POST .../actions waits for the action before answering 202. */
export const ActionWaitQuery = z
  .object({
    waitMs: z
      .string()
      .regex(/^[0-9]+$/, 'must be a whole number of milliseconds')
      .transform(Number)
      .pipe(ActionWaitMs)
      .optional(),
  })
  .strict();

const ListRunsFields = {
  status: RunStatus.optional(),
  // Decimal digits only: Number() would also take ' 5', '0x10' and '1e2'.
  limit: z
    .string()
    .regex(/^[0-9]+$/, 'must be a whole number')
    .transform(Number)
    .pipe(RunListLimit)
    .optional(),
};
export const ListRunsQuery = z.object(ListRunsFields).strict();
export const FileQuery = z.object({ path: WorkspacePath }).strict();
/** A page of the pending interactions: `after` is the `next` of the page before. */
export const PendingInteractionsQuery = z
  .object({
    limit: ListRunsFields.limit,
    after: z
      .string()
      .max(2048)
      .refine((a) => decodeCursor(a) !== null, 'not a page cursor this API gave')
      .optional(),
  })
  .strict();
export const PendingInteractionList = z.object({
  interactions: z.array(PendingInteraction),
  next: z.string().optional(),
});

/** GET /api/v1/sandboxes: an unknown filter is refused rather than ignored. */
export const ListSandboxesQuery = z
  .object({
    state: SandboxState.optional(),
    /** `key:value`; repeat it to require several labels. */
    label: z.union([z.string(), z.array(z.string())]).optional(),
    pageSize: z
      .string()
      .regex(/^[0-9]+$/, 'must be a whole number')
      .transform(Number)
      .pipe(z.number().int().min(1).max(MAX_PAGE_SIZE))
      .optional(),
    nextPageToken: z.string().optional(),
  })
  .strict();

export const RunStarted = z.object({ runId: z.string() });
export const RunList = z.object({ runs: z.array(RunSnapshot) });
/** Who a token is: GET /api/v1/me. */
export const Me = z.object({ name: z.string(), role: z.enum(ROLES) });
export type Me = z.infer<typeof Me>;

export const ErrorBody = z.object({ error: z.object({ code: z.string(), message: z.string() }) });
export type ErrorBody = z.infer<typeof ErrorBody>;

export function errorBody(err: StasisError): ErrorBody {
  return { error: { code: err.code, message: err.message } };
}
