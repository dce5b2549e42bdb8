import type { WorkflowInterceptorsFactory } from '@temporalio/workflow';
import type { coresdk } from '@temporalio/proto';
import { PATCH_RUN_BASELINE_2, PATCH_RUN_BASELINE_3, PATCH_RUN_BASELINE_4 } from './run-controller';
import { PATCH_ONE_UPSERT } from './visibility';

// Merges the search-attribute upserts of one activation into one command (one history event
// instead of one per change). Only in workflows that set the PATCH_ONE_UPSERT marker, or a Run's
// PATCH_RUN_BASELINE_2, _3 or _4 that hold it, which their first activation does: histories recorded before
// hold one upsert per change and must replay as they were. Registered in the bundle (workers/worker.ts, workflowInterceptorModules).

type Command = coresdk.workflow_commands.IWorkflowCommand;

/** The upserts merged into the last one's place; a later value of an attribute wins. */
export function oneUpsert(commands: Command[]): Command[] {
  const upserts = commands.filter((c) => c.upsertWorkflowSearchAttributes);
  if (upserts.length < 2) return commands;
  const last = upserts[upserts.length - 1];
  const indexedFields = Object.assign(
    {},
    ...upserts.map((c) => c.upsertWorkflowSearchAttributes?.searchAttributes?.indexedFields ?? {}),
  );
  const merged: Command = { ...last, upsertWorkflowSearchAttributes: { searchAttributes: { indexedFields } } };
  return commands.filter((c) => !c.upsertWorkflowSearchAttributes || c === last).map((c) => (c === last ? merged : c));
}

/** Markers whose workflows merge their upserts from their first activation on. */
const MERGING_MARKERS = [PATCH_ONE_UPSERT, PATCH_RUN_BASELINE_2, PATCH_RUN_BASELINE_3, PATCH_RUN_BASELINE_4];

export const interceptors: WorkflowInterceptorsFactory = () => {
  let merging = false;
  return {
    internals: [
      {
        concludeActivation(input, next) {
          merging ||= input.commands.some((c) => MERGING_MARKERS.includes(c.setPatchMarker?.patchId ?? ''));
          return next(merging ? { ...input, commands: oneUpsert(input.commands) } : input);
        },
      },
    ],
  };
};
