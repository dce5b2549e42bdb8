import type { z } from 'zod';

// The one home of Stasis's error facts: error codes with their HTTP status and
// whether a retry can fix them, Run and sandbox end reasons, the gRPC statuses
// the client reads, and the cause-chain walker. Workflows import this module, so
// it stays free of Node APIs and of zod at run time (types only).

/**
 * Every error code (docs/DESIGN.md, Error codes): its HTTP status, and whether a
 * Temporal retry of an activity failing with it may succeed. Each code must decide both.
 */
const CODES = {
  INVALID_ARGUMENT: { status: 400, retryable: false },
  UNAUTHORIZED: { status: 401, retryable: true },
  /** The token's role does not allow it. */
  FORBIDDEN: { status: 403, retryable: true },
  NOT_FOUND: { status: 404, retryable: false },
  ALREADY_EXISTS: { status: 409, retryable: true },
  INVALID_STATE_TRANSITION: { status: 409, retryable: false },
  SANDBOX_SUSPEND_BUSY: { status: 409, retryable: true },
  ALREADY_ANSWERED: { status: 409, retryable: true },
  STALE_SANDBOX_ROUTE: { status: 409, retryable: true },
  STALE_FENCE: { status: 409, retryable: false },
  IDEMPOTENCY_CONFLICT: { status: 409, retryable: false },
  RESUME_HASH_MISMATCH: { status: 409, retryable: true },
  /** An exec job an earlier attempt started but did not finish: it is not run twice. */
  JOB_INTERRUPTED: { status: 409, retryable: false },
  CHECKPOINT_INVALID: { status: 422, retryable: false },
  PAYLOAD_TOO_LARGE: { status: 413, retryable: true },
  /** The request's headers are larger than the HTTP server takes. */
  HEADERS_TOO_LARGE: { status: 431, retryable: false },
  /** The request did not arrive whole in the HTTP server's time. */
  REQUEST_TIMEOUT: { status: 408, retryable: false },
  NOT_SUPPORTED: { status: 501, retryable: false },
  INTERNAL: { status: 500, retryable: true },
  /** A provider's word that a sandbox broke beyond repair (the sandbox becomes `failed`). */
  SANDBOX_FAILED: { status: 500, retryable: false },
  UNAVAILABLE: { status: 503, retryable: true },
} as const satisfies Record<string, { status: number; retryable: boolean }>;

export type ErrorCode = keyof typeof CODES;

const ALL_CODES = Object.keys(CODES) as ErrorCode[];

/** The HTTP status of each error code. */
export const ERROR_STATUS = Object.fromEntries(ALL_CODES.map((code) => [code, CODES[code].status])) as {
  readonly [C in ErrorCode]: (typeof CODES)[C]['status'];
};

/**
 * The one non-retryable set: codes a retry can never fix. Activities raise them as
 * non-retryable failures, and every activity retry policy lists them.
 */
export const NON_RETRYABLE_CODES: readonly ErrorCode[] = ALL_CODES.filter((code) => !CODES[code].retryable);

/** A retry policy's `nonRetryableErrorTypes`: the one non-retryable set (a fresh array, as the SDK's type asks). */
export function nonRetryableErrorTypes(): string[] {
  return [...NON_RETRYABLE_CODES];
}

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.prototype.hasOwnProperty.call(CODES, value);
}

/**
 * Why a Run or sandbox ended without its own result, in its `error.code` (beside an
 * error code, e.g. RESUME_HASH_MISMATCH, or a driver's own code).
 */
export const END_REASON = {
  /** It outlived its policy's ttl. */
  TTL_EXPIRED: 'TTL_EXPIRED',
  /** It stayed suspended longer than the retention period. */
  SUSPEND_EXPIRED: 'SUSPEND_EXPIRED',
  /** Its host restarted and its processes did not survive (sandboxes). */
  LOST: 'LOST',
  /** The agent's driver said it failed, naming no code of its own. */
  AGENT_FAILED: 'AGENT_FAILED',
  /**
   * The Run's workflow failed with no error code of ours, or Temporal closed it without the Run's
   * own end (terminated, timed out): the client reports such a Run FAILED with this code.
   */
  RUN_FAILED: 'RUN_FAILED',
  /**
   * What the Run must carry to continue as new (its spec, its agent's state and last result, its
   * children), with all it can forget forgotten, is over the bound Temporal takes (run-agent.ts,
   * PATCH_CARRIED_FITS): it fails, its compute released, rather than be terminated by Temporal.
   */
  STATE_TOO_LARGE: 'STATE_TOO_LARGE',
} as const;

export type EndReason = (typeof END_REASON)[keyof typeof END_REASON];

/** gRPC status codes the client tells apart (grpc.io status codes). */
export const GRPC_STATUS = {
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  FAILED_PRECONDITION: 9,
  UNAVAILABLE: 14,
} as const;

/** A refusal: the code and message an Update validator, API or provider answers with. */
export interface Rejection {
  code: ErrorCode;
  message: string;
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

/** `err` as a StasisError: itself, or INTERNAL with its message (after `what`, when given). */
export function toInternal(err: unknown, what?: string): StasisError {
  if (err instanceof StasisError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new StasisError('INTERNAL', what === undefined ? message : `${what}: ${message}`);
}

/**
 * `err` and the errors it was caused by, outermost first (Temporal wraps a failure in
 * one failure per hop: update, child workflow, activity, gRPC). Stops at a non-Error or a cycle.
 */
export function* causeChain(err: unknown): Generator<Error> {
  const seen = new Set<unknown>();
  for (let e: unknown = err; e instanceof Error && !seen.has(e); e = (e as { cause?: unknown }).cause) {
    seen.add(e);
    yield e;
  }
}

/** The first error in `err`'s cause chain that `test` accepts. */
export function findCause<T extends Error>(err: unknown, test: (e: Error) => e is T): T | undefined;
export function findCause(err: unknown, test: (e: Error) => boolean): Error | undefined;
export function findCause(err: unknown, test: (e: Error) => boolean): Error | undefined {
  for (const e of causeChain(err)) if (test(e)) return e;
  return undefined;
}

/** `value` parsed by `schema`, or INVALID_ARGUMENT naming `what` and each bad field. */
export function parseOrInvalid<S extends z.ZodType>(schema: S, value: unknown, what: string): z.infer<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new StasisError('INVALID_ARGUMENT', `${what}: ${describeIssues(parsed.error.issues)}`);
  return parsed.data;
}

/** zod issues as one line naming each field. */
export function describeIssues(issues: { path: PropertyKey[]; message: string }[]): string {
  return issues
    .map((issue) => `${issue.path.length ? issue.path.map(String).join('.') : '(root)'}: ${issue.message}`)
    .join('; ');
}
