// A worker process holding bwrap sandboxes, for the restart test in bwrap.test.ts. Run with
//   node -r scripts/register-ts.js test/providers/bwrap-worker.ts <dataDir> <hostId> <retained> <running>
// It provisions and starts both sandboxes, writes a file into each, starts a long job in
// `running` (a counter in its workspace), prints READY and waits to be killed.
import * as path from 'node:path';
import { createBwrapProvider } from '../../providers/bwrap';
import { FsCheckpointStore } from '../../stores/fs';

async function main(): Promise<void> {
  setInterval(() => undefined, 60_000); // as a real worker's connections do, this keeps the process alive
  const [dataDir, hostId, retained, running] = process.argv.slice(2);
  const provider = createBwrapProvider({ hostId, dataDir, store: new FsCheckpointStore(path.join(dataDir, 'store')) });
  const context = { ownerId: 'bwrap-worker', hostId };
  for (const sandboxId of [retained, running]) {
    await provider.provision({ sandboxId, fence: 1 }, context);
    await provider.start({ sandboxId, fence: 1 }, context);
    await provider.writeFile({ sandboxId, path: 'kept.txt', content: Buffer.from(sandboxId) }, context);
  }
  void provider.exec(
    {
      sandboxId: running,
      fence: 1,
      jobId: 'counter',
      command: 'i=0; while true; do i=$((i+1)); echo $i > counter; sleep 0.02; done',
    },
    context,
  );
  process.stdout.write('READY\n');
}

main().catch((err: unknown) => {
  process.stderr.write(`bwrap-worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
