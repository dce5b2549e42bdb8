import * as fs from 'node:fs';

// Polling helpers for servers that take a few seconds to come up.

/** An error that retrying cannot fix (e.g. a search attribute registered with another type). */
export class PermanentError extends Error {}

/**
 * Calls `attempt` until it resolves. Stops early when `gaveUp` returns a reason
 * (the process died) or `attempt` throws a PermanentError.
 */
export async function retryUntil<T>(
  what: string,
  timeoutMs: number,
  gaveUp: (() => string | undefined) | undefined,
  attempt: () => Promise<T>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      return await attempt();
    } catch (error) {
      if (error instanceof PermanentError) throw new Error(`${what}: ${error.message}`, { cause: error });
      last = error;
    }
    const reason = gaveUp?.();
    if (reason) throw new Error(`${what} did not come up: ${reason}`);
    if (Date.now() > deadline) {
      throw new Error(`${what} did not answer within ${Math.round(timeoutMs / 1000)} s: ${String(last)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** The last lines of a log file, for error messages. */
export function logTail(file: string, lines = 20): string {
  try {
    return fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}
