import { readFile } from 'node:fs/promises';
import type { AgentDriver } from '../../drivers/api';
import { releasedView } from '../helpers/runs';
import { startStack, eventually, type TestStack } from '../helpers/stack';
import { checkpointKeys, storedKeys, testS3 } from '../helpers/s3';

// A driver that "thinks" until the test lets it go, so idle time is real.
let release: (() => void) | undefined;
const thinking: AgentDriver = {
  name: 'thinking',
  async step({ state }) {
    const step = (state as number | undefined) ?? 0;
    if (step === 0)
      return {
        action: {
          type: 'job',
          command: 'echo start',
          pauseBehavior: 'CANCEL',
          executionAffinity: 'SANDBOX',
          background: false,
        },
        state: 1,
      };
    if (step === 1) {
      await new Promise<void>((resolve) => (release = resolve));
      return {
        action: {
          type: 'job',
          command: 'echo awake',
          pauseBehavior: 'CANCEL',
          executionAffinity: 'SANDBOX',
          background: false,
        },
        state: 2,
      };
    }
    return { action: { type: 'complete', output: 'woke up' }, state: 3 };
  },
};

let stack: TestStack;
const s3 = testS3();
beforeAll(async () => {
  stack = await startStack({ worker: { drivers: [thinking] } });
});
afterAll(async () => {
  release?.();
  await stack?.stop();
});

test('retention expiry: compute released, checkpoint deleted, interactions expired, answers get STALE_SANDBOX_ROUTE', async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ ask: 'anyone?' }] },
    sandbox: { provider: 'local' },
    policy: { suspendedRetentionSeconds: 3 },
  });
  const { sandboxId } = (await releasedView(stack.client, runId, 30_000)).record;
  expect(await checkpointKeys(s3, sandboxId)).toHaveLength(1);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('EXPIRED');
  expect(snapshot.error?.code).toBe('SUSPEND_EXPIRED');
  expect(snapshot.interactions[0].status).toBe('expired');
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
  await expect(stack.client.runs.respond(runId, 'int-1', { decision: 'approve' })).rejects.toMatchObject({
    code: 'STALE_SANDBOX_ROUTE',
    httpStatus: 409,
  });
});

test('retention expiry deletes every checkpoint the Run ever had, not only the latest', async () => {
  // Two suspensions: the first answer restores from the first checkpoint (fence 1), the
  // second question releases again under a higher fence, then the Run expires.
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps: [{ ask: 'first?' }, { exec: 'echo more > more.txt' }, { ask: 'second?' }] },
    sandbox: { provider: 'local' },
    policy: { suspendedRetentionSeconds: 20 },
  });
  const { sandboxId } = (await releasedView(stack.client, runId, 30_000)).record;
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await eventually(
    async () => {
      const view = await stack.client.runs.resource(runId);
      return view.record.state === 'RELEASED' && view.suspension?.interactionIds.includes('int-2');
    },
    30_000,
    'second release',
  );
  expect((await checkpointKeys(s3, sandboxId)).length).toBeGreaterThanOrEqual(1);
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  expect((await stack.client.runs.get(runId)).error?.code).toBe('SUSPEND_EXPIRED');
  expect(await storedKeys(s3, sandboxId)).toEqual([]);
});

test('idleTimeout freezes the sandbox while the agent is quiet; the next job thaws it', async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'thinking' },
    sandbox: { provider: 'local' },
    policy: { idleTimeout: '1s' },
  });
  const sandboxId = `${runId}-sbx`;
  // No job runs while the agent thinks: every process of the sandbox (its init) is frozen.
  await frozen(sandboxId);
  release?.();
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('woke up');
});

test("idleTimeout freezes an external agent's sandbox while the agent thinks; its next action thaws it", async () => {
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'external' },
    sandbox: { provider: 'local' },
    policy: { idleTimeout: '1s' },
  });
  const act = (actionId: string, command: string) =>
    stack.client.runs.act(runId, { actionId, action: { type: 'exec', command } }, { waitMs: 60_000 });
  await expect(act('first', 'echo one > n.txt')).resolves.toMatchObject({ status: 'succeeded' });
  const sandboxId = `${runId}-sbx`;
  await frozen(sandboxId);
  // A command in a frozen sandbox would never finish: it ran, so the action thawed it first.
  await expect(act('second', 'cat n.txt')).resolves.toMatchObject({ status: 'succeeded', result: { stdout: 'one\n' } });
  await stack.client.runs.act(runId, { actionId: 'end', action: { type: 'complete', output: 'thawed' } });
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toBe('thawed');
});

test('ttl ends the Run with TTL_EXPIRED whatever its state and leaves no process', async () => {
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ exec: 'sleep 600', background: true, pauseBehavior: 'CONTINUE' }, { ask: 'forever?' }],
    },
    sandbox: { provider: 'local' },
    policy: { ttl: '3s' },
  });
  await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('EXPIRED');
  expect(snapshot.error?.code).toBe('TTL_EXPIRED');
  expect(snapshot.interactions[0].status).toBe('cancelled');
  const provider = stack.workers.get('host-a')!.registry.get('local');
  expect(await provider.processCount(`${runId}-sbx`)).toBe(0);
  expect((await stack.client.runs.resource(runId)).record.state).toBe('DESTROYED');
});

/** Waits until every process of the sandbox (its init at least) is frozen. */
async function frozen(sandboxId: string): Promise<void> {
  await eventually(
    async () => {
      const states = await processStates(sandboxId);
      return states.length > 0 && states.every((s) => s === 'frozen');
    },
    30_000,
    'sandbox frozen',
  );
}

/**
 * States of the sandbox's processes, read from /proc: `frozen` for a process stopped by
 * SIGSTOP (state T) or in a frozen cgroup v2 group (where the host lets the worker freeze
 * by cgroup), otherwise its scheduler state (R, S, ...).
 */
async function processStates(sandboxId: string): Promise<string[]> {
  const { readdir } = await import('node:fs/promises');
  const states: string[] = [];
  for (const pid of (await readdir('/proc')).filter((d) => /^\d+$/.test(d))) {
    const environ = await readFile(`/proc/${pid}/environ`).catch(() => Buffer.alloc(0));
    if (!environ.toString().split('\0').includes(`STASIS_SANDBOX_ID=${sandboxId}`)) continue;
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    if (!state || state === 'Z') continue;
    states.push(state === 'T' || (await inFrozenGroup(pid)) ? 'frozen' : state);
  }
  return states;
}

/** Whether the process's cgroup v2 group reports `frozen 1` in its cgroup.events. */
async function inFrozenGroup(pid: string): Promise<boolean> {
  const own = await readFile(`/proc/${pid}/cgroup`, 'utf8').catch(() => '');
  const groupPath = own
    .split('\n')
    .find((l) => l.startsWith('0::'))
    ?.slice(3);
  if (!groupPath) return false;
  const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
  for (const line of mountinfo.split('\n')) {
    const [left, right] = line.split(' - ');
    if (!right?.startsWith('cgroup2 ')) continue;
    const [, , , root, mountPoint] = left.split(' ');
    if (!groupPath.startsWith(root)) continue;
    const events = await readFile(`${mountPoint}/${groupPath.slice(root.length)}/cgroup.events`, 'utf8').catch(
      () => '',
    );
    if (/^frozen 1$/m.test(events)) return true;
  }
  return false;
}
