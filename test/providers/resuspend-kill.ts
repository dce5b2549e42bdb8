import * as path from 'node:path';
import { createLocalProvider } from '../../providers/local';
import { withLifecycleLock } from '../../providers/lock';
import { FsCheckpointStore } from '../../stores/fs';

// The worker of resuspend.test's kill test, in a process of its own: it releases a running
// sandbox with a snapshot and dies (SIGKILL) right after the receipt, before the work a release
// leaves for after its receipt (the baseline write, the unmount) can run: a holder of the
// sandbox's lifecycle lock queued behind the release keeps that work waiting until the kill.

const [dataDir, hostId, sandboxId, fence] = process.argv.slice(2);

async function main(): Promise<void> {
  const store = new FsCheckpointStore(path.join(dataDir, 'store'));
  const provider = createLocalProvider({ hostId, dataDir, store, volumes: 'required' });
  const receipt = provider.release(
    {
      sandboxId,
      fence: Number(fence),
      idempotencyKey: `${sandboxId}/${fence}`,
      mode: 'SNAPSHOT_AND_TERMINATE',
      reason: 'test',
    },
    { ownerId: 'test-owner', hostId },
  );
  // Queued while the release holds the lock, so ahead of what the release leaves; never let go.
  void withLifecycleLock(sandboxId, () => new Promise<void>(() => undefined));
  const done = await receipt;
  process.stdout.write(`RECEIPT ${JSON.stringify(done)}\n`, () => process.kill(process.pid, 'SIGKILL'));
}

main().catch((err: unknown) => {
  process.stderr.write(`${String(err)}\n`);
  process.exit(1);
});
