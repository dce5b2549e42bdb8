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
