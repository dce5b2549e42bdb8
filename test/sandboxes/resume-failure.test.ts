import { CopyObjectCommand, DeleteObjectCommand } from '@aws-sdk/client-s3';
import * as path from 'node:path';
import { evictUnderPressure } from '../../providers/maintenance';
import { sandboxesDir } from '../../providers/sandbox-state';
import { checkpointKeys, testS3 } from '../helpers/s3';
import { startStack, type TestStack } from '../helpers/stack';

// A resume whose restore fails must leave the sandbox suspended and resumable:
// one failure never bricks it.

let stack: TestStack;
const s3 = testS3();
const bucket = process.env.STASIS_S3_BUCKET;
beforeAll(async () => {
  stack = await startStack({ hostId: 'host-a' });
});
afterAll(async () => {
  await stack?.stop();
});

/** Deletes the dormant copies on host-a, so a resume has to download its checkpoint. */
async function evictDormantCopies(): Promise<string[]> {
  const dir = sandboxesDir(path.join(stack.config.STASIS_DATA_DIR, 'hosts', 'host-a'));
  const { evicted } = await evictUnderPressure({ sandboxesDir: dir, minFreeBytes: 1, freeBytes: async () => 0 });
  return evicted;
}

test('a resume that fails while the checkpoint is unavailable rolls back to suspended, and a retry resumes', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.writeFile(sandboxId, 'notes.txt', Buffer.from('keep me'));
  const suspended = await stack.client.sandboxes.suspend(sandboxId);
  expect(suspended.record.state).toBe('RELEASED');
  expect(await evictDormantCopies()).toContain(sandboxId);

  // The checkpoint object is away for a while (moved aside in the store).
  const [key] = await checkpointKeys(s3, sandboxId);
  const aside = `aside/${key}`;
  await s3.send(new CopyObjectCommand({ Bucket: bucket, CopySource: `${bucket}/${key}`, Key: aside }));
  await s3.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
  await expect(stack.client.sandboxes.resume(sandboxId)).rejects.toMatchObject({ code: 'NOT_FOUND' });
  const after = await stack.client.sandboxes.get(sandboxId);
  expect(after.state).toBe('suspended');
  expect(after.record.state).toBe('RELEASED');
  expect(after.record.checkpoint).toEqual(suspended.record.checkpoint);
  expect(after.record.lastError).toContain('does not exist');

  // Back in the store: the next resume works, with the files.
  await s3.send(new CopyObjectCommand({ Bucket: bucket, CopySource: `${bucket}/${aside}`, Key: key }));
  await s3.send(new DeleteObjectCommand({ Bucket: bucket, Key: aside }));
  const resumed = await stack.client.sandboxes.resume(sandboxId);
  expect(resumed).toMatchObject({ state: 'running', record: { state: 'ACTIVE' } });
  expect(resumed.record.fence).toBeGreaterThan(after.record.fence);
  expect((await stack.client.sandboxes.readFile(sandboxId, 'notes.txt')).toString()).toBe('keep me');
  await stack.client.sandboxes.destroy(sandboxId);
});
