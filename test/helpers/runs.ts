import type { StasisClient } from '../../client';
import type { ResourceView, RunSpec, StepShape } from '../../common/schemas';
import { eventually, saw } from './stack';

// Waits on a Run's resource, shared by the Run tests and the fault suite.

/** Waits until the Run's resource record is RELEASED (its compute released) and returns that view. */
export async function releasedView(client: StasisClient, runId: string, timeoutMs = 90_000): Promise<ResourceView> {
  return eventually(
    async () => {
      const view = saw(await client.runs.resource(runId));
      return view.record.state === 'RELEASED' ? view : undefined;
    },
    timeoutMs,
    `${runId} released`,
  );
}

/**
 * Starts a scripted Run on the local provider that writes `notes.txt` (`kept`) and holds: its compute keeps
 * running (DETACH). Resolves once it is held, with its id and that view.
 */
export async function startHeld(client: StasisClient): Promise<{ runId: string; held: ResourceView }> {
  const { runId } = await client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [{ exec: 'echo kept > notes.txt' }, { hold: 'review' }, { complete: 'done' }],
    },
    sandbox: { provider: 'local' },
  });
  const held = await eventually(
    async () => {
      const view = saw(await client.runs.resource(runId));
      return view.phase === 'SUSPENDED' && view.record.state === 'RELEASED' ? view : undefined;
    },
    60_000,
    'held',
  );
  return { runId, held };
}

/**
 * A scripted parent Run on the local provider, id `<prefix>-<now>`, that spawns one child (`<parent>.c1`,
 * local, taking `childSteps`) and then takes `then`.
 */
export function parentWithChild(prefix: string, childSteps: StepShape[], then: StepShape[]) {
  const parentId = `${prefix}-${Date.now()}`;
  const childId = `${parentId}.c1`;
  const spec: RunSpec = {
    runId: parentId,
    agent: {
      driver: 'scripted',
      steps: [
        { spawn: { runId: childId, agent: { driver: 'scripted', steps: childSteps }, sandbox: { provider: 'local' } } },
        ...then,
      ],
    },
    sandbox: { provider: 'local' },
  };
  return { parentId, childId, spec };
}
