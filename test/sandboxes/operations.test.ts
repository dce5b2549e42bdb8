import { temporal } from '@temporalio/proto';
import { FILE_LIMIT_BYTES } from '../../common/payload-limits';
import { execSandboxUpdate, sandboxWorkflowId } from '../../workflows/definitions';
import { noPauseProvider } from '../api/no-pause-provider';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';
import { useStack, startStack, eventually } from '../helpers/stack';

const s3 = testS3();
const stack = useStack(() =>
  startStack({
    env: { STASIS_SUSPENDED_RETENTION_SECONDS: '3' },
    worker: { providers: [noPauseProvider] },
  }),
);

async function running(): Promise<string> {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  return sandboxId;
}

test('suspend while a command runs is 409 SANDBOX_SUSPEND_BUSY, without waiting', async () => {
  const id = await running();
  const sleeping = stack.client.sandboxes.exec(id, { command: 'sleep 30' });
  await eventually(
    async () => {
      const view = await stack.client.sandboxes.get(id);
      return (
        view.state === 'running' && (await stack.workers.get('host-a')!.registry.get('local').processCount(id)) > 1
      );
    },
    10_000,
    'command running',
  );
  const started = Date.now();
  await expect(stack.client.sandboxes.suspend(id)).rejects.toMatchObject({
    code: 'SANDBOX_SUSPEND_BUSY',
    httpStatus: 409,
  });
  expect(Date.now() - started).toBeLessThan(5_000);
  await stack.client.sandboxes.destroy(id);
  // Destroy killed the command: it did not finish normally.
  expect(
    await sleeping.then(
      (r) => r.exitCode,
      () => -1,
    ),
  ).not.toBe(0);
});

test('racing suspend and exec: exactly one wins, every time', async () => {
  for (let round = 0; round < 5; round++) {
    const id = await running();
    const [exec, suspend] = await Promise.allSettled([
      stack.client.sandboxes.exec(id, { command: 'sleep 1; echo ran' }),
      stack.client.sandboxes.suspend(id),
    ]);
    const winners = [exec, suspend].filter((r) => r.status === 'fulfilled');
    expect(winners).toHaveLength(1);
    const loser = [exec, suspend].find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(loser.reason).toMatchObject({ httpStatus: 409 });
    expect(['SANDBOX_SUSPEND_BUSY', 'INVALID_STATE_TRANSITION']).toContain(loser.reason.code);
    await stack.client.sandboxes.destroy(id);
  }
});

test('files written before a suspend are there after resume, and processes are 0 while suspended', async () => {
  const id = await running();
  await stack.client.sandboxes.writeFile(id, 'data/hello.bin', Buffer.from([0, 1, 2, 255]));
  await stack.client.sandboxes.exec(id, { command: 'mkdir -p empty/dir && ln -s data/hello.bin link' });
  const suspended = await stack.client.sandboxes.suspend(id);
  expect(suspended.state).toBe('suspended');
  expect(suspended.record).toMatchObject({ state: 'RELEASED', pauseMode: 'SNAPSHOT_AND_TERMINATE' });
  expect(await stack.workers.get('host-a')!.registry.get('local').processCount(id)).toBe(0);
  await expect(stack.client.sandboxes.exec(id, { command: 'true' })).rejects.toMatchObject({
    code: 'INVALID_STATE_TRANSITION',
  });
  const resumed = await stack.client.sandboxes.resume(id);
  expect(resumed.state).toBe('running');
  expect(resumed.record.fence).toBe(suspended.record.fence + 1);
  expect(await stack.client.sandboxes.readFile(id, 'data/hello.bin')).toEqual(Buffer.from([0, 1, 2, 255]));
  await expect(
    stack.client.sandboxes.exec(id, { command: 'test -d empty/dir && readlink link' }),
  ).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'data/hello.bin\n',
  });
  await expect(stack.client.sandboxes.readFile(id, 'missing.txt')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  await expect(stack.client.sandboxes.readFile(id, '../../etc/passwd')).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
  });
  await stack.client.sandboxes.destroy(id);
});

test("writeFile writes a Uint8Array's own bytes, also of a view into a larger buffer, and refuses a string", async () => {
  const id = await running();
  const whole = new Uint8Array([9, 9, 0, 104, 105, 255, 9]);
  await stack.client.sandboxes.writeFile(id, 'view.bin', new Uint8Array(whole.buffer, 2, 4));
  expect(await stack.client.sandboxes.readFile(id, 'view.bin')).toEqual(Buffer.from([0, 104, 105, 255]));
  // A string has no bytes until encoded: base64 of "data" was written as whatever it decoded to.
  await expect(stack.client.sandboxes.writeFile(id, 'notes.txt', 'data' as unknown as Buffer)).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: 'content: must be a Buffer or Uint8Array',
  });
  await stack.client.sandboxes.destroy(id);
});

test('retention expiry releases, deletes the checkpoint, and answers STALE_SANDBOX_ROUTE afterwards', async () => {
  const id = await running();
  await stack.client.sandboxes.suspend(id);
  expect(await checkpointKeys(s3, id)).toHaveLength(1);
  await eventually(
    async () => (await stack.client.sandboxes.get(id)).error?.code === 'SUSPEND_EXPIRED',
    30_000,
    'expired',
  );
  expect(await storedKeys(s3, id)).toEqual([]);
  await expect(stack.client.sandboxes.resume(id)).rejects.toMatchObject({
    code: 'STALE_SANDBOX_ROUTE',
    httpStatus: 409,
  });
  await expect(stack.client.sandboxes.exec(id, { command: 'true' })).rejects.toMatchObject({
    code: 'STALE_SANDBOX_ROUTE',
  });
  await expect(stack.client.sandboxes.destroy(id)).resolves.toMatchObject({ state: 'destroyed' });
});

test('lifecycle policy: timeout pauses an idle sandbox, ttl destroys it', async () => {
  const { sandboxId: idle } = await stack.client.sandboxes.create({ provider: 'local', policy: { timeout: '1s' } });
  await stack.client.sandboxes.start(idle);
  await eventually(async () => (await stack.client.sandboxes.get(idle)).state === 'paused', 20_000, 'auto-paused');
  await expect(stack.client.sandboxes.resume(idle)).resolves.toMatchObject({ state: 'running' });
  await stack.client.sandboxes.destroy(idle);

  const { sandboxId: mortal } = await stack.client.sandboxes.create({ provider: 'local', policy: { ttl: '2s' } });
  await stack.client.sandboxes.start(mortal);
  await eventually(
    async () =>
      stack.client.sandboxes.get(mortal).then(
        () => false,
        (err: { code?: string }) => err.code === 'NOT_FOUND',
      ),
    20_000,
    'destroyed by ttl',
  );
  expect(await stack.workers.get('host-a')!.registry.get('local').processCount(mortal)).toBe(0);
});

test('a provider without the capability answers 501 NOT_SUPPORTED', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'nopause' });
  await stack.client.sandboxes.start(sandboxId);
  await expect(stack.client.sandboxes.pause(sandboxId)).rejects.toMatchObject({
    code: 'NOT_SUPPORTED',
    httpStatus: 501,
  });
  await expect(stack.client.sandboxes.suspend(sandboxId)).rejects.toMatchObject({
    code: 'NOT_SUPPORTED',
    httpStatus: 501,
  });
  expect((await stack.client.sandboxes.get(sandboxId)).state).toBe('running');
  await stack.client.sandboxes.destroy(sandboxId);
});

test('bad input is refused before it reaches the workflow', async () => {
  await expect(stack.client.sandboxes.create({ provider: '' })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining('provider'),
  });
  await expect(stack.client.sandboxes.create({ provider: 'local', policy: { ttl: 'forever' } })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining('policy.ttl'),
  });
  const id = await running();
  await expect(stack.client.sandboxes.exec(id, { command: '' })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringContaining('command'),
  });
  await stack.client.sandboxes.destroy(id);
});

test('an input too large for Temporal is 413 PAYLOAD_TOO_LARGE at the client, and the sandbox keeps working', async () => {
  const id = await running();
  // Each part is valid (1,000,000-character command, 32,000-character values); together 2.3 MB.
  const env = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`V${i}`, 'x'.repeat(32_000)]));
  await expect(stack.client.sandboxes.exec(id, { command: `: ${'y'.repeat(999_990)}`, env })).rejects.toMatchObject({
    code: 'PAYLOAD_TOO_LARGE',
    httpStatus: 413,
    message: expect.stringContaining('exec: must be at most 1048576 bytes'),
  });
  expect(await stack.client.sandboxes.exec(id, { command: 'echo still-here' })).toMatchObject({
    exitCode: 0,
    stdout: 'still-here\n',
  });
  await stack.client.sandboxes.destroy(id);

  const steps = Array.from({ length: 3 }, (_, i) => ({ writeFile: { path: `f${i}`, content: 'z'.repeat(900_000) } }));
  const runId = `too-large-${Date.now()}`;
  await expect(
    stack.client.runs.start({ runId, agent: { driver: 'scripted', steps }, sandbox: { provider: 'local' } }),
  ).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE', message: expect.stringContaining('spec: must be at most') });
  await expect(stack.client.runs.get(runId)).rejects.toMatchObject({ code: 'NOT_FOUND' });
});

test('a workspace file the sandbox made larger than a file call carries is 413 at once, and the sandbox stays free', async () => {
  const id = await running();
  // 1 MiB + 1 byte failed the activity's completion (a 500); 3 MiB and more were retried for minutes, the
  // sandbox busy meanwhile (a suspend refused with SANDBOX_SUSPEND_BUSY).
  for (const bytes of [FILE_LIMIT_BYTES, FILE_LIMIT_BYTES + 1, 3 * FILE_LIMIT_BYTES, 20 * FILE_LIMIT_BYTES]) {
    await stack.client.sandboxes.exec(id, { command: `head -c ${bytes} /dev/urandom > big.bin` });
    const read = stack.client.sandboxes.readFile(id, 'big.bin');
    if (bytes === FILE_LIMIT_BYTES) {
      expect((await read).length).toBe(bytes);
      continue;
    }
    await expect(read).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE', httpStatus: 413 });
    const history = await stack.temporal.workflow.getHandle(sandboxWorkflowId(id)).fetchHistory();
    const failed = (history.events ?? []).filter((e) => e.activityTaskFailedEventAttributes).at(-1);
    expect(failed?.activityTaskFailedEventAttributes?.retryState).toBe(
      temporal.api.enums.v1.RetryState.RETRY_STATE_NON_RETRYABLE_FAILURE,
    );
  }
  expect(await stack.client.sandboxes.suspend(id)).toMatchObject({ state: 'suspended' });
  await stack.client.sandboxes.destroy(id);
});

test('a raw Temporal client sending an exec too large to carry is refused by the validator; the sandbox keeps working', async () => {
  const id = await running();
  const handle = stack.client.temporal.workflow.getHandle(sandboxWorkflowId(id));
  // Two-byte characters: under the typed client's character count, over 1 MiB as UTF-8 JSON.
  const input = { command: `: ${'é'.repeat(999_000)}` };
  await expect(handle.executeUpdate(execSandboxUpdate, { args: [input] })).rejects.toMatchObject({
    cause: expect.objectContaining({ type: 'PAYLOAD_TOO_LARGE' }),
  });
  expect(await stack.client.sandboxes.exec(id, { command: 'echo still-here' })).toMatchObject({
    exitCode: 0,
    stdout: 'still-here\n',
  });
  await stack.client.sandboxes.destroy(id);
});
