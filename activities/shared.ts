import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { AgentAction, type AgentDriver, type AgentStepInput, type AgentStepOutput } from '../drivers/api';
import type { ExecResult } from '../common/schemas';
import { runExternalJob } from '../providers/external-jobs';
import { checkpointPrefix } from '../providers/snapshot';
import type { CheckpointStore } from '../stores/api';
import { execActivityResult } from './exec-output';

// Host-independent activities on the shared task queue.

/** How often a driver step under way tells Temporal it is alive (its heartbeat timeout is 1 minute). */
const STEP_HEARTBEAT_MS = 10_000;

/**
 * A driver step (an LLM call may take minutes) heartbeats while it runs, so it is not timed out and
 * started again after the activity's heartbeat timeout, and it ends when the activity is cancelled
 * (a worker shutting down, the Run cancelled) instead of holding the worker: a driver that ignores
 * cancellation is left to finish in the background, its answer unused.
 */
async function whileStepping<T>(step: Promise<T>): Promise<T> {
  const context = Context.current();
  // A local activity (a fast driver) neither heartbeats nor waits for one.
  if (context.info.isLocal) return step;
  const beat = setInterval(() => context.heartbeat(), STEP_HEARTBEAT_MS);
  try {
    return await Promise.race([step, context.cancelled]);
  } finally {
    clearInterval(beat);
  }
}

export interface SharedActivityDeps {
  drivers: Map<string, AgentDriver>;
  store: CheckpointStore;
  hostId: string;
  /** This host's data dir: EXTERNAL jobs work in throwaway directories under it. */
  dataDir: string;
}

export function createSharedActivities(deps: SharedActivityDeps) {
  return {
    /** One agent step: the driver's answer, validated before the workflow sees it. */
    async agentStep(input: AgentStepInput & { driver: string }): Promise<AgentStepOutput> {
      const driver = deps.drivers.get(input.driver);
      if (!driver) {
        throw ApplicationFailure.create({
          type: 'NOT_FOUND',
          message: `agent driver ${JSON.stringify(input.driver)} is not registered on this worker`,
          nonRetryable: true,
        });
      }
      const out = await whileStepping(driver.step(input));
      const action = AgentAction.safeParse(out.action);
      if (!action.success) {
        throw ApplicationFailure.create({
          type: 'INVALID_ARGUMENT',
          message: `driver ${input.driver} answered an invalid action: ${action.error.message}`,
          nonRetryable: true,
        });
      }
      return { action: action.data, state: out.state };
    },

    async deleteCheckpoint(input: { uri: string }): Promise<void> {
      await deps.store.delete(input.uri);
    },

    /** Every checkpoint a sandbox ever had, whatever its fence. */
    async deleteSandboxCheckpoints(input: { sandboxId: string }): Promise<void> {
      // Scheduled with a heartbeat timeout (workflows/coordinator.ts): a prefix of many objects takes long.
      const activity = Context.current();
      const beat = setInterval(() => activity.heartbeat(), 5_000);
      try {
        await deps.store.deletePrefix(checkpointPrefix(input.sandboxId));
      } finally {
        clearInterval(beat);
      }
    },

    /**
     * An EXTERNAL job runs beside the sandbox, never in it, so it never holds its compute; it is
     * jailed like a sandbox of the Run's `provider` (providers/external-jobs.ts).
     */
    async runExternalJob(input: {
      command: string;
      env?: Record<string, string>;
      provider?: string;
      timeoutMs?: number;
      /** false: the caller throws the output away (a background job), the result carries none. */
      keepOutput?: false;
    }): Promise<ExecResult> {
      const activity = Context.current();
      const beat = setInterval(() => activity.heartbeat(), 5_000);
      try {
        const { keepOutput, ...request } = input;
        const outcome = await runExternalJob(deps, { ...request, signal: activity.cancellationSignal });
        return execActivityResult(outcome, keepOutput);
      } finally {
        clearInterval(beat);
      }
    },
  };
}

export type SharedActivities = ReturnType<typeof createSharedActivities>;
