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

/** What Node's HTTP parser refuses before fastify sees a request, in the contract's terms. */
export function clientFailure(err: { code?: string }): StasisError {
  if (err.code === 'HPE_HEADER_OVERFLOW')
    return new StasisError('HEADERS_TOO_LARGE', 'headers: larger than the server takes');
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT')
    return new StasisError('REQUEST_TIMEOUT', 'request: not received in time');
  // The parser's code names the fault (HPE_INVALID_HEADER_TOKEN, ...); its message may quote the bytes.
  return new StasisError('INVALID_ARGUMENT', `request: not valid HTTP (${err.code ?? 'unreadable'})`);
}
