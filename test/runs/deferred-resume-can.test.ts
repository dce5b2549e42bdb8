import type { StepShape } from '../../common/schemas';
import { eventually, saw, startStackOnOwnTemporal, useStack } from '../helpers/stack';

// An agent that only asks is, between its steps, always RESUMING: each answer defers the resume to
// the next action (PATCH_LEAN_CYCLE), and that action is the next ask (skipped since
// PATCH_STAY_RELEASED). Continue-as-new is admitted only between steps of an ACTIVE Run, so such a
// Run never continued as new and its history grew until Temporal ended it. A server of its own
// suggests continue-as-new after a few events, so the Run must really continue as new here.
const stack = useStack(() => startStackOnOwnTemporal(40));

/** The Temporal run of the Run's workflow that is current now. */
async function currentRun(workflowId: string): Promise<string> {
  return (await stack.temporal.workflow.getHandle(workflowId).describe()).runId;
}

test('a Run that only asks continues as new, and the workspace it wrote before is there at the end', async () => {
  const asks = 10;
  const steps: StepShape[] = [
    { writeFile: { path: 'notes.txt', content: 'before the asks' } },
    ...Array.from({ length: asks }, (_, i) => ({ ask: `question ${i + 1}?` })),
    { exec: 'cat notes.txt' },
  ];
  const { runId } = await stack.client.runs.start({
    agent: { driver: 'scripted', steps },
    sandbox: { provider: 'local' },
    policy: { pauseMode: 'SNAPSHOT_AND_TERMINATE' },
  });
  let before = '';
  let during = '';
  for (let i = 1; i <= asks; i++) {
    const id = `int-${i}`;
    await eventually(
      async () => {
        const s = saw(await stack.client.runs.get(runId));
        return s.interactions.some((x) => x.id === id && x.status === 'pending') ? s : undefined;
      },
      90_000,
      `${runId} asks ${id}`,
    );
    // Whatever continued as new before the first answer did so between the steps before the asks.
    if (i === 1) before = await currentRun(runId);
    // The exec at the end lets an ACTIVE Run continue as new: the asks must have done so already.
    if (i === asks) during = await currentRun(runId);
    await stack.client.runs.respond(runId, id, { decision: 'approve' });
  }
  await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toMatchObject({
    exitCode: 0,
    stdout: 'before the asks',
  });
  expect(during).not.toBe(before);
  const snapshot = await stack.client.runs.get(runId);
  expect(snapshot.status).toBe('COMPLETED');
  expect(snapshot.interactions.map((i) => i.status)).toEqual(Array.from({ length: asks }, () => 'answered'));
});
