import type { Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/common';
import fc from 'fast-check';
import { OwnedWorkflows } from '../../client/owned-workflows';

// The check that a workflow id is of the client's own task queue (client/owned-workflows.ts): what it
// costs (one describe per id, none for an id it remembers, a bounded memory) and what it refuses.

interface Fake {
  client: Client;
  described: string[];
  /** `id → first run id` the handles for Updates were bound to. */
  bound: [string, string | undefined][];
}

/** A Temporal client whose workflows are `queues` (id → [task queue, type]), each chain's first run `first-<id>`. */
function fakeClient(queues: Record<string, [string, string]>): Fake {
  const fake: Fake = { client: undefined as unknown as Client, described: [], bound: [] };
  fake.client = {
    workflow: {
      getHandle: (workflowId: string, _runId?: string, options?: { firstExecutionRunId?: string }) => ({
        workflowId,
        firstExecutionRunId: options?.firstExecutionRunId,
        describe: async () => {
          fake.described.push(workflowId);
          const found = queues[workflowId];
          if (!found) throw new WorkflowNotFoundError('not found', workflowId, undefined);
          return {
            taskQueue: found[0],
            type: found[1],
            status: { name: 'RUNNING' },
            raw: { workflowExecutionInfo: { firstRunId: `first-${workflowId}` } },
          };
        },
      }),
    },
  } as unknown as Client;
  return fake;
}

const firstOf = (handle: unknown) => (handle as { firstExecutionRunId?: string }).firstExecutionRunId;

test('an id of another queue or type is NOT_FOUND as an unknown one, and is never remembered', async () => {
  const fake = fakeClient({ mine: ['q-a', 'runWorkflow'], theirs: ['q-b', 'runWorkflow'], other: ['q-a', 'x'] });
  const owned = new OwnedWorkflows('q-a', 'runWorkflow');
  for (const id of ['theirs', 'other', 'none']) {
    await expect(owned.describe(fake.client, id, `run ${id}`)).rejects.toMatchObject({
      code: 'NOT_FOUND',
      message: `run ${id} not found`,
    });
    await expect(owned.forUpdate(fake.client, id, `run ${id}`)).rejects.toMatchObject({ code: 'NOT_FOUND' });
  }
  expect(owned.size).toBe(0);
  const { handle } = await owned.describe(fake.client, 'mine', 'run mine');
  expect(firstOf(handle)).toBe('first-mine');
});

test('Updates to an id checked once, or started by the client, cost no describe, bound to its chain', async () => {
  const fake = fakeClient({ mine: ['q-a', 'sandboxWorkflow'], started: ['q-a', 'sandboxWorkflow'] });
  const owned = new OwnedWorkflows('q-a', 'sandboxWorkflow');
  owned.remember('started', 'chain-0');
  for (let i = 0; i < 3; i++) {
    expect(firstOf(await owned.forUpdate(fake.client, 'mine', 'sandbox mine'))).toBe('first-mine');
    expect(firstOf(await owned.forUpdate(fake.client, 'started', 'sandbox started'))).toBe('chain-0');
  }
  expect(fake.described).toEqual(['mine']);
  owned.forget('mine');
  await owned.forUpdate(fake.client, 'mine', 'sandbox mine');
  expect(fake.described).toEqual(['mine', 'mine']);
});

test('the memory is bounded: past `max` ids, the id checked longest ago is forgotten first', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 1, max: 8 }),
      fc.array(fc.integer({ min: 0, max: 15 }), { maxLength: 60 }),
      async (max, calls) => {
        const ids = Object.fromEntries(
          Array.from({ length: 16 }, (_, i) => [`w${i}`, ['q', 'runWorkflow'] as [string, string]]),
        );
        const fake = fakeClient(ids);
        const owned = new OwnedWorkflows('q', 'runWorkflow', max);
        const model: string[] = []; // remembered, oldest first
        for (const n of calls) {
          const id = `w${n}`;
          const before = fake.described.length;
          await owned.forUpdate(fake.client, id, `run ${id}`);
          // Remembered: no describe; otherwise one, and it is remembered from then on.
          expect(fake.described.length - before).toBe(model.includes(id) ? 0 : 1);
          if (!model.includes(id)) {
            model.push(id);
            if (model.length > max) model.shift();
          }
          expect(owned.size).toBe(model.length);
        }
      },
    ),
  );
});
