import { existsSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import type { ExecResult } from '../../common/schemas';
import { HISTORY_GUARD_BYTES } from '../../workflows/lifecycle';
import { execSandboxUpdate, readFileUpdate, sandboxWorkflowId, writeFileUpdate } from '../../workflows/definitions';
import { releaseAll, startedInDir, UNTIL_RELEASED } from '../helpers/released';
import { eventually, startStackOnTemporalWith, useStack } from '../helpers/stack';

// The attack of the review: one long exec keeps running (so the sandbox is never quiet and cannot
// continue as new) while further execs keep arriving, each answering 128 KiB of control characters on
// stdout and on stderr (~1.5 MiB of JSON, stored twice). Without a bound, history grew until Temporal
// terminated the workflow at 50 MiB and the sandbox was left behind. Here on a Temporal server that
// never suggests continue-as-new (as one may: the guard must hold alone), so the room the sandbox
// keeps is all that stops it; and a quiet sandbox must continue as new on its own.
const stack = useStack(() =>
  startStackOnTemporalWith([
    'limit.historyCount.suggestContinueAsNew=1000000',
    'limit.historySize.suggestContinueAsNew=1073741824',
  ]),
);

/** 128 KiB of NUL on stdout and on stderr: each is `\u0000` (6 bytes) in the JSON of the result. */
const BIG = 'head -c 131072 /dev/zero; head -c 131072 /dev/zero >&2';

afterEach(releaseAll);

type Refusal = { type?: string; message?: string; nonRetryable?: boolean };

const historySize = async (workflowId: string, runId?: string): Promise<number> =>
  Number(
    (await stack.temporal.workflow.getHandle(workflowId, runId).describe()).raw.workflowExecutionInfo?.historySizeBytes,
  );

test('beside a long exec, calls are taken until the history keeps no room for more, then refused for now; the history stays under the guard; after it, the sandbox continues as new and takes the retried call', async () => {
  const { sandboxId, dir } = await startedInDir(stack);
  const workflowId = sandboxWorkflowId(sandboxId);
  const firstRunId = (await stack.temporal.workflow.getHandle(workflowId).describe()).runId;
  const long: Promise<ExecResult> = stack.client.sandboxes.exec(sandboxId, {
    command: `${UNTIL_RELEASED}; echo long-done`,
  });
  await eventually(
    async () => (await stack.workers.get('host-a')!.registry.get('local').processCount(sandboxId)) > 1,
    10_000,
    'long exec running',
  );
  // On the raw Temporal client (no retry): taken, taken, … refused.
  const raw = stack.temporal.workflow.getHandle(workflowId, firstRunId);
  let refusal: Refusal | undefined;
  let taken = 0;
  for (let i = 0; i < 20 && refusal === undefined; i++) {
    try {
      expect((await raw.executeUpdate(execSandboxUpdate, { args: [{ command: BIG }] })).exitCode).toBe(0);
      taken += 1;
    } catch (err) {
      refusal = (err as { cause?: Refusal }).cause;
    }
  }
  // Far past the 4 MiB at which a default server suggests continue-as-new (refusing there locked every
  // call out for as long as the long exec ran), and never past the guard.
  const sizeAtRefusal = await historySize(workflowId, firstRunId);
  expect(taken).toBeGreaterThanOrEqual(8);
  expect(sizeAtRefusal).toBeGreaterThan(20 * 1024 * 1024);
  expect(sizeAtRefusal).toBeLessThan(HISTORY_GUARD_BYTES);
  expect(refusal).toMatchObject({
    type: 'UNAVAILABLE',
    nonRetryable: false,
    message: expect.stringMatching(
      /keeps room for the 1 commands and file operations under way, and none for more; .*; retry$/,
    ),
  });
  // Refused calls leave no trace, file operations too; a small call is still taken.
  for (let i = 0; i < 3; i++) {
    await expect(raw.executeUpdate(execSandboxUpdate, { args: [{ command: BIG }] })).rejects.toMatchObject({
      cause: { type: 'UNAVAILABLE' },
    });
  }
  await expect(raw.executeUpdate(readFileUpdate, { args: [{ path: 'x' }] })).rejects.toMatchObject({
    cause: { type: 'UNAVAILABLE', nonRetryable: false },
  });
  await expect(
    raw.executeUpdate(writeFileUpdate, { args: [{ path: 'x', contentBase64: 'eA==' }] }),
  ).rejects.toMatchObject({ cause: { type: 'UNAVAILABLE', nonRetryable: false } });
  expect(await historySize(workflowId, firstRunId)).toBe(sizeAtRefusal);

  // The typed client (and so REST, CLI and MCP) sends a refused call again with backoff: it waits.
  let retriedSettled = false;
  const retried = stack.client.sandboxes.exec(sandboxId, { command: 'echo after' });
  void retried.finally(() => (retriedSettled = true)).catch(() => undefined);
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  expect(retriedSettled).toBe(false);

  // The long exec ends and answers, and the retried call is taken.
  writeFileSync(path.join(dir, 'release'), '');
  await expect(long).resolves.toMatchObject({ exitCode: 0, stdout: 'long-done\n' });
  await expect(retried).resolves.toMatchObject({ exitCode: 0, stdout: 'after\n' });
  // (Taken where there was room again, or by the next run: either way the history stays under the guard.)
  expect(await historySize(workflowId, firstRunId)).toBeLessThan(HISTORY_GUARD_BYTES);
  await stack.client.sandboxes.writeFile(sandboxId, 'f.txt', Buffer.from('kept'));
  expect((await stack.client.sandboxes.readFile(sandboxId, 'f.txt')).toString()).toBe('kept');
  expect(existsSync(path.join(dir, 'f.txt'))).toBe(true);
  await stack.client.sandboxes.destroy(sandboxId);
}, 120_000);

test('a quiet sandbox keeps taking calls on a server that never suggests continue-as-new: it continues as new on its own when no room is left', async () => {
  const { sandboxId } = await stack.client.sandboxes.create({ provider: 'local' });
  await stack.client.sandboxes.start(sandboxId);
  const workflowId = sandboxWorkflowId(sandboxId);
  const firstRunId = (await stack.temporal.workflow.getHandle(workflowId).describe()).runId;
  // ~3 MiB of history each: 16 of them are more than the 40 MiB guard. Before, at 36 MiB every exec was
  // refused for good (no room for one, nothing under way to make room, no suggestion to continue as new).
  for (let i = 0; i < 16; i++) {
    await expect(stack.client.sandboxes.exec(sandboxId, { command: BIG })).resolves.toMatchObject({ exitCode: 0 });
  }
  const first = stack.temporal.workflow.getHandle(workflowId, firstRunId);
  expect((await first.describe()).status.name).toBe('CONTINUED_AS_NEW');
  expect(await historySize(workflowId, firstRunId)).toBeLessThan(HISTORY_GUARD_BYTES);
  await stack.client.sandboxes.destroy(sandboxId);
}, 120_000);
