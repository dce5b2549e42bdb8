import { clientOptions, StasisClient, type RunSnapshot, type RunSpec } from 'stasis';
import { createStasisWorker, loadConfig } from 'stasis/worker';
import { echoDriver } from './driver';
import { createDirProvider } from './provider';

// A worker with the consumer's own driver and provider, and one Run through them
// started with the typed client. Prints the finished Run as JSON.

async function main(): Promise<void> {
  const config = loadConfig(process.env);
  const worker = await createStasisWorker({ config, drivers: [echoDriver], providers: [createDirProvider] });
  const running = worker.run();
  const client = await StasisClient.connect(clientOptions(config));
  try {
    const spec: RunSpec = {
      agent: { driver: echoDriver.name, input: process.argv[2] ?? 'hello' },
      sandbox: { provider: 'consumer-dirs' },
      labels: { from: 'consumer' },
    };
    const { runId } = await client.runs.start(spec);
    await client.temporal.workflow.getHandle(runId).result();
    const snapshot: RunSnapshot = await client.runs.get(runId);
    process.stdout.write(JSON.stringify(snapshot) + '\n');
  } finally {
    await client.close();
    await worker.shutdown();
    await running;
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
