// Polling for a condition, with what was last seen in the timeout message: apart from the stack
// (test/helpers/stack.ts re-exports it) for the tests that start none (the cluster test).

let lastSeen: unknown;
/** Lets a check record what it saw, so a timeout says what the state was. */
export function saw<T>(value: T): T {
  lastSeen = value;
  return value;
}

/** Polls until `check` returns a value (not undefined/false), or fails after `timeoutMs`. */
export async function eventually<T>(
  check: () => Promise<T | undefined | false>,
  timeoutMs = 30_000,
  what = 'condition',
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined && value !== false) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline && lastSeen !== undefined) last ??= `last seen ${JSON.stringify(lastSeen)}`;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
