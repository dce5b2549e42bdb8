import * as path from 'node:path';

// Runs a bench script's main and exits with its outcome. The sandboxes' init processes are
// detached: without the interval the loop could end while a restore waits on one.
export function runScript(main: () => Promise<void>): void {
  const keepAlive = setInterval(() => undefined, 1000);
  main().then(
    () => {
      clearInterval(keepAlive);
      process.exit(0);
    },
    (err: unknown) => {
      console.error(err);
      process.exit(1);
    },
  );
}

/** A module of this build's dist by its path from the top (`providers/spawner`), as a mutable record (to wrap its functions). */
export function loadDist(rel: string): Record<string, unknown> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return require(path.join(__dirname, '..', rel)) as Record<string, unknown>;
}
