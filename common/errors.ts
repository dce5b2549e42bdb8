// Error codes of the contract (SPEC sections 2-5) and the HTTP status each maps to.
// Workflows raise them as ApplicationFailure types; the client, API, CLI and MCP
// surface them as StasisError.
export const ERROR_STATUS = {
  INVALID_ARGUMENT: 400,
  UNAUTHORIZED: 401,
  /** The token's role does not allow it. */
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  ALREADY_EXISTS: 409,
  INVALID_STATE_TRANSITION: 409,
  SANDBOX_SUSPEND_BUSY: 409,
  ALREADY_ANSWERED: 409,
  STALE_SANDBOX_ROUTE: 409,
  STALE_FENCE: 409,
  IDEMPOTENCY_CONFLICT: 409,
  RESUME_HASH_MISMATCH: 409,
  /** An exec job an earlier attempt started but did not finish: it is not run twice. */
  JOB_INTERRUPTED: 409,
  CHECKPOINT_INVALID: 422,
  PAYLOAD_TOO_LARGE: 413,
  NOT_SUPPORTED: 501,
  INTERNAL: 500,
  /** A provider's word that a sandbox broke beyond repair (the sandbox becomes `failed`). */
  SANDBOX_FAILED: 500,
  UNAVAILABLE: 503,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.prototype.hasOwnProperty.call(ERROR_STATUS, value);
}

/** The one error class of every Stasis surface. */
export class StasisError extends Error {
  readonly httpStatus: number;
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'StasisError';
    this.httpStatus = ERROR_STATUS[code];
  }
}

/** Codes a retry can never fix; activities raise them as non-retryable failures. */
export const NON_RETRYABLE_CODES: ErrorCode[] = [
  'INVALID_ARGUMENT',
  'NOT_FOUND',
  'STALE_FENCE',
  'IDEMPOTENCY_CONFLICT',
  'NOT_SUPPORTED',
  'CHECKPOINT_INVALID',
  'INVALID_STATE_TRANSITION',
  'SANDBOX_FAILED',
  'JOB_INTERRUPTED',
];

/** zod issues as one line naming each field. */
export function describeIssues(issues: { path: PropertyKey[]; message: string }[]): string {
  return issues
    .map((issue) => `${issue.path.length ? issue.path.map(String).join('.') : '(root)'}: ${issue.message}`)
    .join('; ');
}
