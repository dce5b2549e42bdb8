import { context } from './helpers';
import { makeHost, sh } from './harness';

// A provider call whose attempt Temporal has cancelled (timed out: a retry may already run on another
// host) starts no compute: a restore puts the files in place and stops before the start, a start starts
// nothing. Otherwise two hosts could run the same sandbox, and a resume's job run twice.

const aborted = () => {
  const controller = new AbortController();
  controller.abort(new Error('activity timed out'));
  return controller.signal;
};

test('a restore whose call was cancelled starts no process; the next attempt restores and runs', async () => {
  const source = await makeHost();
  const id = await source.sandbox();
  await sh(source.provider, id, 'echo kept > note.txt');
  const { checkpoint } = await source.provider.release(
    { sandboxId: id, idempotencyKey: `${id}/2`, mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
    context(),
  );
  const target = await makeHost({ store: source.store });
  const request = { sandboxId: id, fence: 3, checkpoint: checkpoint! };
  await expect(target.provider.restore(request, context({ signal: aborted() }))).rejects.toThrow(
    /activity timed out|aborted/,
  );
  expect(await target.provider.processCount(id)).toBe(0);
  // Retried (here, or on another host), the restore completes.
  await target.provider.restore(request, context());
  expect(await sh(target.provider, id, 'cat note.txt', 3)).toBe('kept\n');
});

test('a start whose call was cancelled starts no process', async () => {
  const host = await makeHost();
  const id = await host.sandbox({ start: false });
  await expect(host.provider.start({ sandboxId: id, fence: 1 }, context({ signal: aborted() }))).rejects.toThrow(
    'activity timed out',
  );
  expect(await host.provider.processCount(id)).toBe(0);
  await host.provider.start({ sandboxId: id, fence: 1 }, context());
  expect(await host.provider.processCount(id)).toBe(1);
});
