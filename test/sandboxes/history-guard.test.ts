import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import type { ExecResult } from '../../common/schemas';
import {
  execSandboxUpdate,
  readFileUpdate,
  resumeSandboxUpdate,
  sandboxWorkflowId,
  writeFileUpdate,
} from '../../workflows/definitions';
import { useStack, startStackOnOwnTemporal, eventually } from '../helpers/stack';

// The attack of the review: one long exec keeps running (so the sandbox is never quiet and cannot
// continue as new) while further execs keep arriving, each answering ~128 KiB of control characters
// (~786 KB of JSON, stored twice: the activity's result and the Update's). Without a bound, history
// grows until Temporal terminates the workflow at 50 MB and the sandbox is left behind. A Temporal
// server of its own suggests continue-as-new after a few events too (its size threshold is the
// default 4 MiB), so the suggestion comes within the test whichever comes first.
const SUGGEST_AFTER_EVENTS = 80;
const stack = useStack(() => startStackOnOwnTemporal(SUGGEST_AFTER_EVENTS));

/** 128 KiB of NUL on stdout: each is `\u0000` (6 bytes) in the JSON of the result. */
const CONTROL_FLOOD = 'head -c 131072 /dev/zero';
/** More attacking execs than it takes the server to suggest continue-as-new several times over. */
const ATTACKS = 15;

/** Workspaces of the long execs: each ends once the test is over, passed or failed. */
const workspaces: string[] = [];
afterEach(() => {
  for (const dir of workspaces.splice(0)) writeFileSync(path.join(dir, 'release'), '');
});

interface Attacked {
  sandboxId: string;
  workflowId: string;
  firstRunId: string;
  /** The workspace: creating `release` in it ends the long exec. */
  dir: string;
  long: Promise<ExecResult>;
  accepted: number;
  refusal: { type?: string; message?: string; nonRetryable?: boolean } | undefined;
  afterAttack: WorkflowExecutionDescription;
}

/** A running sandbox with a long exec under way, flooded (on the raw Temporal client, no retry) until an exec is refused. */
async function attacked(): Promise<Attacked> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'history-guard-'));
  const { sandboxId } = await stack.client.sandboxes.create({
    provider: 'local',
    workspace: { kind: 'active', hostPath: dir },
  });
  await stack.client.sandboxes.start(sandboxId);
  const workflowId = sandboxWorkflowId(sandboxId);
  const firstRunId = (await stack.temporal.workflow.getHandle(workflowId).describe()).runId;
  const long = stack.client.sandboxes.exec(sandboxId, {
    command: 'while [ ! -e release ]; do sleep 0.1; done; echo long-done',
  });
  workspaces.push(dir);
  await eventually(
    async () => (await stack.workers.get('host-a')!.registry.get('local').processCount(sandboxId)) > 1,
    10_000,
    'long exec running',
  );
  const raw = stack.temporal.workflow.getHandle(workflowId, firstRunId);
  let refusal: Attacked['refusal'];
  let accepted = 0;
  for (let i = 0; i < ATTACKS && refusal === undefined; i++) {
    try {
      const out = await raw.executeUpdate(execSandboxUpdate, { args: [{ command: CONTROL_FLOOD }] });
      expect(out.exitCode).toBe(0);
      accepted += 1;
    } catch (err) {
      const failure = (err as { cause?: Attacked['refusal'] }).cause;
      refusal = { type: failure?.type, message: failure?.message, nonRetryable: failure?.nonRetryable };
    }
  }
  const afterAttack = await raw.describe();
  return { sandboxId, workflowId, firstRunId, dir, long, accepted, refusal, afterAttack };
}

test('while a long exec runs, calls past the continue-as-new suggestion are refused (retryable) and history stops growing; after it, the workflow continues as new and takes calls again', async () => {
  const { sandboxId, workflowId, firstRunId, dir, long, accepted, refusal, afterAttack } = await attacked();
  // The sandbox took execs until Temporal suggested continue-as-new (here at 4 MiB of history, the
  // server's default size threshold, before the 80 events), then no more: without the bound every
  // one was taken, ~1.6 MB of history each.
  expect(afterAttack.historySize).toBeLessThan(8 * 1024 * 1024);
  expect(accepted).toBeGreaterThan(0);
  expect(refusal).toMatchObject({
    type: 'UNAVAILABLE',
    nonRetryable: false,
    message: expect.stringMatching(/continuing as new .*once its running command.*; retry$/),
  });
  expect(afterAttack.status.name).toBe('RUNNING');

  // Refused calls leave no trace: the history stays as it was, however many arrive.
  const raw = stack.temporal.workflow.getHandle(workflowId, firstRunId);
  for (let i = 0; i < 5; i++) {
    await expect(raw.executeUpdate(execSandboxUpdate, { args: [{ command: CONTROL_FLOOD }] })).rejects.toMatchObject({
      cause: { type: 'UNAVAILABLE' },
    });
  }
  const afterRefusals = await raw.describe();
  expect(afterRefusals.historyLength).toBe(afterAttack.historyLength);
  expect(afterRefusals.historySize).toBe(afterAttack.historySize);

  // The typed client (and so REST, CLI and MCP) retries such a refusal with backoff: this exec
  // waits, unrecorded, for the long one to end.
  let retriedSettled = false;
  const retried = stack.client.sandboxes.exec(sandboxId, { command: 'echo after' });
  void retried.finally(() => (retriedSettled = true)).catch(() => undefined);
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  expect(retriedSettled).toBe(false);
  expect((await raw.describe()).historyLength).toBe(afterAttack.historyLength);

  // The long exec ends and its result is delivered; the workflow then continues as new.
  writeFileSync(path.join(dir, 'release'), '');
  await expect(long).resolves.toMatchObject({ exitCode: 0, stdout: 'long-done\n' });
  await expect(retried).resolves.toMatchObject({ exitCode: 0, stdout: 'after\n' });
  expect((await raw.describe()).status.name).toBe('CONTINUED_AS_NEW');
  const now = await stack.temporal.workflow.getHandle(workflowId).describe();
  expect(now.runId).not.toBe(firstRunId);
  expect(now.status.name).toBe('RUNNING');

  // The new run takes calls as before, files included.
  await expect(stack.client.sandboxes.exec(sandboxId, { command: 'echo again' })).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'again\n',
  });
  await stack.client.sandboxes.writeFile(sandboxId, 'f.txt', Buffer.from('kept'));
  expect((await stack.client.sandboxes.readFile(sandboxId, 'f.txt')).toString()).toBe('kept');
  expect(existsSync(path.join(dir, 'f.txt'))).toBe(true);
  await stack.client.sandboxes.destroy(sandboxId);
}, 55_000);

test('meanwhile file operations and state changes are refused too, but stop is taken: it ends the long exec, and the workflow continues as new', async () => {
  const { sandboxId, workflowId, firstRunId, long, refusal, afterAttack } = await attacked();
  expect(refusal).toMatchObject({ type: 'UNAVAILABLE', nonRetryable: false });
  const raw = stack.temporal.workflow.getHandle(workflowId, firstRunId);
  const refusedForNow = { cause: { type: 'UNAVAILABLE', nonRetryable: false } };
  await expect(raw.executeUpdate(readFileUpdate, { args: [{ path: 'x' }] })).rejects.toMatchObject(refusedForNow);
  await expect(
    raw.executeUpdate(writeFileUpdate, { args: [{ path: 'x', contentBase64: 'eA==' }] }),
  ).rejects.toMatchObject(refusedForNow);
  // A resume of a running sandbox answers with its state: taken again and again, it too would grow the history.
  await expect(raw.executeUpdate(resumeSandboxUpdate)).rejects.toMatchObject(refusedForNow);
  expect((await raw.describe()).historyLength).toBe(afterAttack.historyLength);

  await expect(stack.client.sandboxes.stop(sandboxId)).resolves.toMatchObject({ state: 'stopped' });
  // Stopped under it, the long exec ends (not normally) and its answer comes back.
  expect(
    await long.then(
      (r) => r.exitCode,
      () => -1,
    ),
  ).not.toBe(0);
  await eventually(async () => (await raw.describe()).status.name === 'CONTINUED_AS_NEW', 10_000, 'continued as new');
  await expect(stack.client.sandboxes.start(sandboxId)).resolves.toMatchObject({ state: 'running' });
  await expect(stack.client.sandboxes.exec(sandboxId, { command: 'echo back' })).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'back\n',
  });
  await stack.client.sandboxes.destroy(sandboxId);
}, 55_000);
