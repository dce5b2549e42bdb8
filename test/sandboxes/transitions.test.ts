import type { SandboxState } from '../../common/schemas';
import type { StasisClient } from '../../client';
import { killSandbox } from '../../providers/processes';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { startStack, eventually, type TestStack } from '../helpers/stack';
import { IDEMPOTENT, LEGAL, USER_OPS } from '../helpers/transition-table';

// Every sandbox state (docs/DESIGN.md, Sandboxes), reached for real, and every operation tried on it
// through the sandbox workflow's Updates.

const faults: ReleaseFaults = { calls: [], broken: ['stop'] };
let stack: TestStack;
let client: StasisClient;
beforeAll(async () => {
  stack = await startStack({ worker: { providers: [faultyProvider(faults)] } });
  client = stack.client;
});
afterAll(async () => {
  await stack?.stop();
});

/** A fresh sandbox brought into `state` the way a user (or a fault) would. */
async function sandboxIn(state: Exclude<SandboxState, 'destroyed'>): Promise<string> {
  const provider = state === 'failed' ? 'faulty' : 'local';
  const { sandboxId } = await client.sandboxes.create({ provider });
  if (state === 'created') return sandboxId;
  await client.sandboxes.start(sandboxId);
  if (state === 'stopped') await client.sandboxes.stop(sandboxId);
  if (state === 'paused') await client.sandboxes.pause(sandboxId);
  if (state === 'suspended') await client.sandboxes.suspend(sandboxId);
  if (state === 'failed')
    await expect(client.sandboxes.stop(sandboxId)).rejects.toMatchObject({ code: 'SANDBOX_FAILED' });
  if (state === 'lost') await loseAfterWorkerRestart(sandboxId);
  expect((await client.sandboxes.get(sandboxId)).state).toBe(state);
  return sandboxId;
}

/** The worker restarts and finds the sandbox's processes gone: reconcile marks it lost. */
async function loseAfterWorkerRestart(sandboxId: string): Promise<void> {
  await stack.stopWorker('host-a');
  // The processes die with the worker's restart (as they would with the host's).
  await killSandbox({ sandboxId, hostId: 'host-a' });
  await stack.startWorker('host-a');
  await eventually(
    async () => (await client.sandboxes.get(sandboxId)).state === 'lost',
    30_000,
    'lost after reconcile',
  );
}

const STATES = ['created', 'running', 'stopped', 'paused', 'suspended', 'failed', 'lost'] as const;

describe.each(STATES)('from %s', (state) => {
  let shared: string;
  beforeAll(async () => {
    shared = await sandboxIn(state);
  });

  const illegal = USER_OPS.filter((op) => !LEGAL[`${state}/${op}`] && !IDEMPOTENT.has(`${state}/${op}`));
  const idempotent = USER_OPS.filter((op) => IDEMPOTENT.has(`${state}/${op}`));
  const legal = USER_OPS.filter((op) => LEGAL[`${state}/${op}`]);

  test.each(illegal)('%s is refused with 409 and changes nothing', async (op) => {
    const handle = stack.temporal.workflow.getHandle(`sandbox-${shared}`);
    const before = (await handle.fetchHistory()).events?.length;
    await expect(client.sandboxes[op](shared)).rejects.toMatchObject({
      code: 'INVALID_STATE_TRANSITION',
      httpStatus: 409,
      message: 'sandbox: invalid state transition',
    });
    expect((await handle.fetchHistory()).events?.length).toBe(before);
    expect((await client.sandboxes.get(shared)).state).toBe(state);
  });

  if (idempotent.length > 0) {
    test.each(idempotent)('%s is idempotent: 200 with the current state', async (op) => {
      await expect(client.sandboxes[op](shared)).resolves.toMatchObject({ state });
    });
  }

  test.each(legal)('%s is legal', async (op) => {
    const sandboxId = await sandboxIn(state);
    const to = LEGAL[`${state}/${op}`];
    const view = await client.sandboxes[op](sandboxId);
    expect(view.state).toBe(to);
    if (to === 'destroyed') {
      await expect(client.sandboxes.get(sandboxId)).rejects.toMatchObject({ code: 'NOT_FOUND', httpStatus: 404 });
      await expect(client.sandboxes.start(sandboxId)).rejects.toMatchObject({ code: 'NOT_FOUND', httpStatus: 404 });
    } else {
      expect((await client.sandboxes.get(sandboxId)).state).toBe(to);
    }
    if (to === 'running') {
      await expect(client.sandboxes.exec(sandboxId, { command: 'echo ok' })).resolves.toMatchObject({
        exitCode: 0,
        stdout: 'ok\n',
      });
    }
  });
});

test('an unknown sandbox is 404', async () => {
  await expect(client.sandboxes.get('sbx-nope')).rejects.toMatchObject({ code: 'NOT_FOUND', httpStatus: 404 });
  await expect(client.sandboxes.start('sbx-nope')).rejects.toMatchObject({ code: 'NOT_FOUND', httpStatus: 404 });
});

test('a sandbox whose provider no worker has fails to create naming it, and leaves nothing listed, shown or to destroy', async () => {
  const tag = `probe:${Date.now().toString(36)}`;
  const [key, value] = tag.split(':');
  // Was INTERNAL ("Workflow Update failed because the Workflow completed before the Update completed"),
  // and the sandbox stayed `created` in every list; then it was listed and shown `failed` for good while
  // destroy said it was not found (destroyed): a 400 that left a sandbox nobody could remove.
  const err = await client.sandboxes.create({ provider: 'no-such-provider', labels: { [key]: value } }).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toMatchObject({
    code: 'INVALID_ARGUMENT',
    httpStatus: 400,
    message: expect.stringContaining('provider: no sandbox provider named "no-such-provider" on this worker'),
  });
  // Its workflow, found in Temporal (the refusal names no sandbox id), has ended and published `failed`.
  const query = `TaskQueue = '${stack.config.STASIS_TASK_QUEUE}' AND StasisLabels = '${tag}' AND StasisStatus = 'failed'`;
  const workflowId = await eventually(
    async () => {
      for await (const wf of stack.temporal.workflow.list({ query }))
        if (wf.status.name === 'FAILED') return wf.workflowId;
      return undefined;
    },
    30_000,
    'the refused sandbox published failed',
  );
  const sandboxId = workflowId.slice('sandbox-'.length);
  for (const state of [undefined, 'failed', 'created', 'destroyed'] as const)
    expect((await client.sandboxes.list({ label: [tag], ...(state ? { state } : {}) })).sandboxes).toEqual([]);
  const gone = { code: 'NOT_FOUND', httpStatus: 404, message: `sandbox ${sandboxId} not found (destroyed)` };
  await expect(client.sandboxes.get(sandboxId)).rejects.toMatchObject(gone);
  await expect(client.sandboxes.destroy(sandboxId)).rejects.toMatchObject(gone);
});

test('a sandbox whose workflow was terminated in Temporal is gone alike: no list shows it, get and destroy are NOT_FOUND', async () => {
  const tag = `term:${Date.now().toString(36)}`;
  const [key, value] = tag.split(':');
  const { sandboxId } = await client.sandboxes.create({ provider: 'local', labels: { [key]: value } });
  await client.sandboxes.start(sandboxId);
  await stack.temporal.workflow.getHandle(`sandbox-${sandboxId}`).terminate('by hand');
  // Visibility shows the termination a moment later.
  for (const state of [undefined, 'running', 'destroyed'] as const)
    await eventually(
      async () => (await client.sandboxes.list({ label: [tag], ...(state ? { state } : {}) })).sandboxes.length === 0,
      30_000,
      `no ${state ?? 'default'} list shows it`,
    );
  const gone = { code: 'NOT_FOUND', httpStatus: 404, message: `sandbox ${sandboxId} not found (destroyed)` };
  await expect(client.sandboxes.get(sandboxId)).rejects.toMatchObject(gone);
  await expect(client.sandboxes.destroy(sandboxId)).rejects.toMatchObject(gone);
});

test('calls waiting on a provisioning that fails for good are refused with its failure, and the workflow ends', async () => {
  // Started straight through Temporal, then started and written to before it is provisioned: each call
  // waited for the provisioning for good (the workflow never ended) once the failure no longer ended it at once.
  const sandboxId = `sbx-unprovisioned-${Date.now().toString(36)}`;
  const handle = await stack.temporal.workflow.start('sandboxWorkflow', {
    taskQueue: stack.config.STASIS_TASK_QUEUE,
    workflowId: `sandbox-${sandboxId}`,
    args: [{ sandboxId, create: { provider: 'no-such-provider' }, suspendedRetentionSeconds: 60 }],
  });
  const refusals = await Promise.all(
    [
      () => client.sandboxes.start(sandboxId),
      () => client.sandboxes.exec(sandboxId, { command: 'true' }),
      () => client.sandboxes.writeFile(sandboxId, 'f.txt', Buffer.from('x')),
    ].map((call) =>
      call().then(
        () => undefined,
        (err: unknown) => err,
      ),
    ),
  );
  for (const err of refusals) expect(err).toBeDefined();
  await expect(handle.result()).rejects.toThrow();
  expect((await handle.describe()).status.name).toBe('FAILED');
}, 120_000);
