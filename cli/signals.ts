// The long-running commands (dev, worker, api, mcp) stop in order on the first
// Ctrl-C or SIGTERM; a second one exits at once.

export function untilStopSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    let stopping = false;
    const onSignal = (signal: NodeJS.Signals): void => {
      if (stopping) process.exit(130);
      stopping = true;
      process.stderr.write(`\nstasis: ${signal} received, stopping (again to force)\n`);
      resolve(signal);
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  });
}
