import { z } from 'zod';
import type { StasisError } from '../common/errors';
import { ROLES } from '../common/roles';
import { Identifier, RunSnapshot, RunStatus, WorkspacePath } from '../common/schemas';

// The REST API's own request and response shapes, built from the wire schemas.

export const RunParams = z.object({ id: Identifier });
export const InteractionParams = z.object({ id: Identifier, iid: Identifier });
export const SandboxParams = z.object({ id: Identifier });

export const ListRunsQuery = z.object({
  status: RunStatus.optional(),
  // Decimal digits only: Number() would also take ' 5', '0x10' and '1e2'.
  limit: z
    .string()
    .regex(/^[0-9]+$/, 'must be a whole number')
    .transform(Number)
    .pipe(z.number().int().min(1).max(1000))
    .optional(),
});
export const FileQuery = z.object({ path: WorkspacePath });

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
