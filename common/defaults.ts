// Defaults that several layers apply, each with one home. Free of zod so workflow
// code can import them.

/** How long a suspended Run or sandbox is kept before it expires: 30 days (0 keeps it forever). */
export const DEFAULT_SUSPENDED_RETENTION_SECONDS = 2_592_000;

/** The shared task queue every Stasis worker polls (STASIS_TASK_QUEUE). */
export const DEFAULT_TASK_QUEUE = 'stasis';

/**
 * What a task queue or host id may be named: letters, digits, ".", "_" and "-" (so it goes into a
 * visibility query and a per-host queue name as it is).
 */
export const QUEUE_NAME = /^[A-Za-z0-9._-]+$/;
/** QUEUE_NAME's rule, as refusals say it. */
export const QUEUE_NAME_RULE = 'must be letters, digits, ".", "_" or "-"';
