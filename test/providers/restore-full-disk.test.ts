import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { toFailure, toRestoreFailure } from '../../activities/failures';
import { WorkerMetrics } from '../../activities/metrics';
import { createProviderActivities } from '../../activities/provider';
import { StasisError, type ErrorCode } from '../../common/errors';
import { createLocalProvider } from '../../providers/local';
import { FsFiguresStore } from '../../stores/figures';
import { newSandboxRoot, take } from '../stores/cas-helpers';
import { mountsUnder, s3StoreFromEnv, tempDir, uniqueId } from './helpers';

// A restore that runs out of disk fails for good (non-retryable UNAVAILABLE), so the resume fails
// and leaves the sandbox suspended: restores are retried with no attempt limit, and a retried one
// held the sandbox (destroy refused meanwhile) for as long as the disk stayed full. Any other
// failure is classified as before.

const SPACE = ['ENOSPC', 'EDQUOT'];

test('property: a failure with ENOSPC or EDQUOT anywhere in its causes is non-retryable UNAVAILABLE; any other is as toFailure has it', () => {
  const leaf = fc.oneof(
    fc
      .constantFrom('ENOSPC', 'EDQUOT', 'EIO', 'EACCES', 'ENOENT', 'EEXIST')
      .map((code) => Object.assign(new Error(`${code}: something, write`), { code, errno: -1, syscall: 'write' })),
    fc
      .constantFrom<ErrorCode>('CHECKPOINT_INVALID', 'NOT_FOUND', 'INTERNAL', 'UNAVAILABLE')
      .map((code) => new StasisError(code, `a ${code}`)),
    fc.string().map((message) => new Error(message)),
  );
  fc.assert(
    fc.property(leaf, fc.nat({ max: 3 }), (inner, depth) => {
      let err: Error = inner;
      for (let i = 0; i < depth; i++) err = new Error(`wrapped ${i}`, { cause: err });
      const failure = toRestoreFailure(err);
      const code = (inner as { code?: unknown }).code;
      if (typeof code === 'string' && SPACE.includes(code)) {
        expect(failure).toBeInstanceOf(ApplicationFailure);
        expect(failure).toMatchObject({ type: 'UNAVAILABLE', nonRetryable: true });
        expect((failure as Error).message).toContain(inner.message);
      } else {
        const expected = toFailure(err);
        if (expected instanceof ApplicationFailure) {
          expect(failure).toMatchObject({
            type: expected.type,
            nonRetryable: expected.nonRetryable,
            message: expected.message,
          });
        } else expect(failure).toBe(expected);
      }
    }),
    { numRuns: 300 },
  );
});

describe('a restore onto a volume too small for its checkpoint (a real ENOSPC)', () => {
  const store = s3StoreFromEnv();
  let checkpoint: Awaited<ReturnType<typeof take>>['checkpoint'];
  let sandboxId: string;
  let dataDir: string;
  let activities: ReturnType<typeof createProviderActivities>;

  beforeAll(async () => {
    const root = await newSandboxRoot();
    sandboxId = uniqueId('full-disk');
    // 24 MiB that does not compress or leave holes, for a 16 MiB volume.
    const handle = await fs.open(path.join(root, 'workspace', 'data.bin'), 'wx');
    for (let i = 0; i < 24; i++) await handle.write(Buffer.alloc(1024 * 1024, i + 1));
    await handle.close();
    ({ checkpoint } = await take(store, root, sandboxId));
    dataDir = await tempDir('full-disk-host');
    const hostId = uniqueId('host');
    const provider = createLocalProvider({ hostId, dataDir, store, volumes: 'required' });
    const metrics = await WorkerMetrics.load(hostId, new FsFiguresStore(path.join(dataDir, 'metrics')));
    activities = createProviderActivities({ hostId, provider: () => provider, metrics, hostPaths: { allowed: [] } });
  }, 120_000);

  const request = () => ({ sandboxId, fence: 2, checkpoint, limits: { diskMiB: 16 } });

  const failure = (promise: Promise<unknown>) =>
    promise.then(
      () => {
        throw new Error('the restore succeeded');
      },
      (err: unknown) => err,
    );

  test('restoreSandbox fails non-retryable UNAVAILABLE naming the lack of space; no mount is left', async () => {
    const err = await failure(
      new MockActivityEnvironment().run(activities.restoreSandbox, {
        provider: 'local',
        ownerId: sandboxId,
        request: request(),
      }),
    );
    expect(err).toBeInstanceOf(ApplicationFailure);
    expect(err).toMatchObject({ type: 'UNAVAILABLE', nonRetryable: true });
    expect((err as Error).message).toMatch(/no space left/);
    expect(mountsUnder(dataDir)).toEqual([]);
  }, 120_000);

  test('the fused resume (resumeAndExecInSandbox) fails the same way, running nothing', async () => {
    const err = await failure(
      new MockActivityEnvironment().run(activities.resumeAndExecInSandbox, {
        provider: 'local',
        ownerId: sandboxId,
        bringBack: { op: 'restore' as const, request: request() },
        expect: { run: 'r'.repeat(64), spec: 's'.repeat(64), policy: 'p'.repeat(64) },
        request: { sandboxId, fence: 2, jobId: 'job-1', command: 'echo ran' },
      }),
    );
    expect(err).toBeInstanceOf(ApplicationFailure);
    expect(err).toMatchObject({ type: 'UNAVAILABLE', nonRetryable: true });
    // No job ran: the failure carries no "resumed, then failed" details.
    expect((err as ApplicationFailure).details ?? []).toEqual([]);
    expect(mountsUnder(dataDir)).toEqual([]);
  }, 120_000);
});
