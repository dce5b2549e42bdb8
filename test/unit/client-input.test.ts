import type { Client } from '@temporalio/client';
import * as fc from 'fast-check';
import { StasisClient } from '../../client';
import { RunId } from '../../common/schemas';

// The typed client refuses a Run id no Run can have and a list limit out of bounds
// itself, with a clear code, before Temporal is asked: Temporal answered an empty or
// oversized workflow id with an opaque INTERNAL ("Workflow Update failed").

/** A Temporal client that notes being asked anything and then fails. */
function untouchable(): { client: Client; asked: () => boolean } {
  let asked = false;
  const trap = (): never => {
    asked = true;
    throw new Error('Temporal was asked');
  };
  const client = new Proxy({}, { get: trap }) as unknown as Client;
  return { client, asked: () => asked };
}

/** What each Run operation of the client answers for `runId`, and whether Temporal was asked. */
async function outcomes(runId: string): Promise<{ codes: unknown[]; asked: boolean }> {
  const temporal = untouchable();
  const runs = new StasisClient(temporal.client).runs;
  const attempts = [
    () => runs.get(runId),
    () => runs.resource(runId),
    () => runs.respond(runId, 'int-1', { decision: 'approve' }),
    () => runs.respondBySignal(runId, 'int-1', { decision: 'approve' }),
    () => runs.suspend(runId),
    () => runs.resume(runId),
    () => runs.cancel(runId),
    () => runs.act(runId, { actionId: 'a1', action: { type: 'exec', command: 'true' } }),
    () => runs.action(runId, 'a1'),
  ];
  const codes: unknown[] = [];
  for (const attempt of attempts) {
    const err = await attempt().then(
      () => undefined,
      (e: unknown) => e as { code?: string; message?: string },
    );
    codes.push(err?.code === 'INVALID_ARGUMENT' && err.message?.startsWith('runId "') ? 'INVALID_ARGUMENT' : err);
  }
  return { codes, asked: temporal.asked() };
}

const notRunIds = fc.oneof(
  fc.constantFrom('', ' ', 'a'.repeat(129), 'ü/..', '-x', 'run-1\n', 'run 1'),
  fc.string({ unit: 'binary', maxLength: 200 }),
);

test('an id that is not a Run id is INVALID_ARGUMENT naming it, for every Run operation, and Temporal is not asked; a sandbox workflow id is NOT_FOUND', async () => {
  await fc.assert(
    fc.asyncProperty(
      notRunIds.filter((id) => !RunId.safeParse(id).success && !id.startsWith('sandbox-')),
      async (id) => {
        expect(await outcomes(id)).toEqual({ codes: Array(9).fill('INVALID_ARGUMENT'), asked: false });
      },
    ),
    { numRuns: 50 },
  );
  const long = await new StasisClient(untouchable().client).runs.get('b'.repeat(2000)).catch((e: unknown) => e);
  expect((long as Error).message).toMatch(/^runId "b{64}…": not a Run id \(.*128.*\)$/);

  // A sandbox's workflow id is well-formed and names no Run: NOT_FOUND; a well-formed Run id goes on to Temporal.
  const sandbox = await outcomes('sandbox-abc');
  expect(sandbox).toEqual({
    codes: Array(9).fill(expect.objectContaining({ code: 'NOT_FOUND', message: 'run sandbox-abc not found' })),
    asked: false,
  });
  expect((await outcomes('run-1.child-2')).asked).toBe(true);
});

test('list and pendingInteractions refuse a limit that is not a whole number from 1 to the REST bound', async () => {
  for (const limit of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 1001]) {
    const temporal = untouchable();
    const runs = new StasisClient(temporal.client).runs;
    await expect(runs.list({ limit })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /^limit: / });
    await expect(runs.pendingInteractions({ limit })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: /^limit: /,
    });
    expect([limit, temporal.asked()]).toEqual([limit, false]);
  }
  // Within the bound the list goes on to Temporal.
  const temporal = untouchable();
  await new StasisClient(temporal.client).runs.list({ limit: 1000 }).catch(() => undefined);
  expect(temporal.asked()).toBe(true);
});
