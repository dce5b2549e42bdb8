import { evictDormantCopies } from '../helpers/hosts';
import { checkpointKeys, moveAside, testS3 } from '../helpers/s3';
import { useStack, startStack } from '../helpers/stack';

// A resume whose restore fails must leave the sandbox suspended and resumable:
// one failure never bricks it.

const s3 = testS3();
const stack = useStack(() => startStack({ hostId: 'host-a' }));

test('a resume that fails while the checkpoint is unavailable rolls back to suspended, and a retry resumes', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  await stack.client.sandboxes.writeFile(sandboxId, 'notes.txt', Buffer.from('keep me'));
  const suspended = await stack.client.sandboxes.suspend(sandboxId);
  expect(suspended.record.state).toBe('RELEASED');
  expect(await evictDormantCopies(stack)).toContain(sandboxId);

  // The checkpoint object is away for a while (moved aside in the store).
  const [key] = await checkpointKeys(s3, sandboxId);
  const putBack = await moveAside(s3, key);
  await expect(stack.client.sandboxes.resume(sandboxId)).rejects.toMatchObject({ code: 'NOT_FOUND' });
  const after = await stack.client.sandboxes.get(sandboxId);
  expect(after.state).toBe('suspended');
  expect(after.record.state).toBe('RELEASED');
  expect(after.record.checkpoint).toEqual(suspended.record.checkpoint);
  expect(after.record.lastError).toContain('does not exist');

  // Back in the store: the next resume works, with the files.
  await putBack();
  const resumed = await stack.client.sandboxes.resume(sandboxId);
  expect(resumed).toMatchObject({ state: 'running', record: { state: 'ACTIVE' } });
  expect(resumed.record.fence).toBeGreaterThan(after.record.fence);
  expect((await stack.client.sandboxes.readFile(sandboxId, 'notes.txt')).toString()).toBe('keep me');
  await stack.client.sandboxes.destroy(sandboxId);
});
