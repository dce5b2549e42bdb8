/** What a cancelled operation rejects with: the signal's reason (Temporal's CancelledFailure in an activity). */
export function abortReason(signal: AbortSignal | undefined, what: string): Error {
  return signal?.reason instanceof Error ? signal.reason : new Error(`${what} cancelled`);
}
