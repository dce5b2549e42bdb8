import type { StasisClient } from '../../client';
import type { ResourceView } from '../../common/schemas';
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
