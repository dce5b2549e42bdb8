import type { FastifyError } from 'fastify';
import { StasisError } from '../common/errors';

// Every failure leaves the API as `{error: {code, message}}` with the status of
// its code. fastify's own 4xx (bad JSON, wrong content type, body too large)
// are mapped into the same codes.

export function httpFailure(err: unknown, bodyLimit: number): StasisError {
  if (err instanceof StasisError) return err;
  const status = (err as Partial<FastifyError>).statusCode;
  if (status === 413) return new StasisError('PAYLOAD_TOO_LARGE', `body: must be at most ${bodyLimit} bytes`);
  if (status !== undefined && status >= 400 && status < 500) {
    return new StasisError('INVALID_ARGUMENT', `body: ${(err as Error).message}`);
  }
  return new StasisError('INTERNAL', 'internal error; see the server log');
}
