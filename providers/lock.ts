// One lifecycle operation at a time per sandbox in this worker process: release,
// restore, destroy and the other state changes of a provider, and the host
// maintenance that deletes dormant copies, all queue on the same lock.

const tails = new Map<string, Promise<void>>();

/** Runs `fn` once every earlier holder of `sandboxId`'s lock has finished (FIFO). */
export async function withLifecycleLock<T>(sandboxId: string, fn: () => Promise<T>): Promise<T> {
  const previous = tails.get(sandboxId) ?? Promise.resolve();
  let unlock = () => {};
  const mine = new Promise<void>((resolve) => (unlock = resolve));
  const tail = previous.then(() => mine);
  tails.set(sandboxId, tail);
  await previous;
  try {
    return await fn();
  } finally {
    unlock();
    // The last holder leaves no entry behind, so the map does not grow with every sandbox ever seen.
    if (tails.get(sandboxId) === tail) tails.delete(sandboxId);
  }
}
