import type { ProviderDeps, SandboxProvider, SandboxReleaseReceipt } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { StasisError } from '../../common/errors';
import type { CheckpointStore } from '../../stores/api';
import type { Checkpoint } from '../../common/schemas';
import { passThrough } from './store-wrap';

/**
 * How one release call fails: `throw` (an exception); `not-released` (a receipt
 * with computeReleased false); `hang` (never answers, until cancelled);
 * `stale-fence` (another owner has raised the sandbox's fence first, so the real
 * provider refuses with STALE_FENCE); `idempotency-conflict` (the same key was
 * already used for a different, DETACH, request, so the real provider refuses
 * with IDEMPOTENCY_CONFLICT); `no-checkpoint` (the real release runs, but its receipt
 * comes back without the checkpoint).
 */
export type ReleaseFault = 'throw' | 'not-released' | 'hang' | 'stale-fence' | 'idempotency-conflict' | 'no-checkpoint';
/**
 * How one restore call fails: `throw` (an exception), `hang` (never answers, until
 * cancelled), `hold` (waits, without heartbeats, until `ReleaseFaults.gate` resolves, then restores),
 * or `unavailable` (refused for good: NOT_FOUND, as when the checkpoint object is missing).
 */
export type RestoreFault = 'throw' | 'hang' | 'hold' | 'unavailable';

/**
 * How one exec call fails: `lost` (the attempt never reaches the provider: it hangs without
 * heartbeats, as a task lost on the way would), `lost-after-run` (the job runs to its end,
 * then its answer is lost the same way).
 */
export type ExecFault = 'lost' | 'lost-after-run';

/**
 * How one checkpoint upload (the store's put, inside a release) fails: `hang-after-upload` (the
 * object is stored whole, then the put never answers until its release is cancelled, so the
 * provider never learns the checkpoint it made).
 */
export type PutFault = 'hang-after-upload';

export interface ProviderCall {
  sandboxId: string;
  fence: number;
  idempotencyKey: string;
  outcome: string;
  /** Date.now() when the call arrived. */
  at: number;
}

/** Faults a test switches on and off while Runs use the `faulty` provider. */
export interface ReleaseFaults {
  /** Every release fails this way while set. */
  release?: ReleaseFault;
  /** When `release` is unset: the fault (if any) for the `attempt`-th release call of `sandboxId` (1-based). */
  releasePlan?: (sandboxId: string, attempt: number) => ReleaseFault | undefined;
  /** The fault (if any) for the `attempt`-th restore call of `sandboxId` (1-based). */
  restorePlan?: (sandboxId: string, attempt: number) => RestoreFault | undefined;
  /** The fault (if any) for the `attempt`-th exec call of `sandboxId` (1-based). */
  execPlan?: (sandboxId: string, attempt: number) => ExecFault | undefined;
  /** Every exec request the provider saw, in order (idempotencyKey is the job id). */
  execCalls?: ProviderCall[];
  /** Operations that answer SANDBOX_FAILED (a sandbox broken beyond repair). */
  broken?: ('exec' | 'stop' | 'pause')[];
  /** Every release request the provider saw, in order. */
  calls: ProviderCall[];
  /** Every restore request the provider saw, in order (idempotencyKey is empty). */
  restoreCalls?: ProviderCall[];
  /** What a `hold` restore waits for. */
  gate?: Promise<void>;
  /** While set, every file write waits for it before it reaches the provider (a slow write). */
  writeGate?: Promise<void>;
  /** Every file write the provider saw, in order (idempotencyKey is the path). */
  writeCalls?: ProviderCall[];
  /** The fault (if any) for the `attempt`-th checkpoint upload of `sandboxId` (1-based). */
  putPlan?: (sandboxId: string, attempt: number) => PutFault | undefined;
  /** Every checkpoint upload the provider's store saw, in order (idempotencyKey is the object key). */
  putCalls?: ProviderCall[];
}

/**
 * The real `local` provider (real processes and files) under the name `faulty`,
 * whose release can be made to fail the ways a provider fails in production.
 */
export function faultyProvider(faults: ReleaseFaults) {
  return (deps: ProviderDeps): SandboxProvider => {
    const local = createLocalProvider({ ...deps, store: faultyStore(deps.store, faults) }, { name: 'faulty' });
    const breakable = (op: 'exec' | 'stop' | 'pause') => {
      if (faults.broken?.includes(op)) throw new StasisError('SANDBOX_FAILED', `injected: sandbox broke during ${op}`);
    };
    const attempts = (calls: ProviderCall[], sandboxId: string) =>
      calls.filter((c) => c.sandboxId === sandboxId).length + 1;
    const hang = async (signal: AbortSignal | undefined, what: string): Promise<never> => {
      await new Promise<void>((resolve) => {
        if (signal?.aborted) resolve();
        signal?.addEventListener('abort', () => resolve());
      });
      throw new Error(`hung ${what} cancelled`);
    };
    return {
      ...local,
      async exec(request, context) {
        breakable('exec');
        const execCalls = (faults.execCalls ??= []);
        const fault = faults.execPlan?.(request.sandboxId, attempts(execCalls, request.sandboxId));
        const call: ProviderCall = {
          sandboxId: request.sandboxId,
          fence: request.fence,
          idempotencyKey: request.jobId,
          outcome: '',
          at: Date.now(),
        };
        execCalls.push(call);
        if (fault === 'lost') {
          call.outcome = 'lost';
          return hang(context.signal, 'exec');
        }
        const outcome = await local.exec(request, context);
        if (fault === 'lost-after-run') {
          call.outcome = 'answer lost';
          return hang(context.signal, 'exec');
        }
        call.outcome = 'answered';
        return outcome;
      },
      async writeFile(request, context) {
        const call: ProviderCall = {
          sandboxId: request.sandboxId,
          fence: request.fence ?? -1,
          idempotencyKey: request.path,
          outcome: 'arrived',
          at: Date.now(),
        };
        (faults.writeCalls ??= []).push(call);
        if (faults.writeGate) {
          call.outcome = 'held';
          await faults.writeGate;
        }
        try {
          await local.writeFile(request, context);
          call.outcome = 'written';
        } catch (err) {
          call.outcome = `refused ${(err as { code?: string }).code ?? String(err)}`;
          throw err;
        }
      },
      async stop(request, context) {
        breakable('stop');
        return local.stop(request, context);
      },
      async pause(request, context) {
        breakable('pause');
        return local.pause(request, context);
      },
      async restore(request, context) {
        const restoreCalls = (faults.restoreCalls ??= []);
        const fault = faults.restorePlan?.(request.sandboxId, attempts(restoreCalls, request.sandboxId));
        const call: ProviderCall = {
          sandboxId: request.sandboxId,
          fence: request.fence,
          idempotencyKey: '',
          outcome: '',
          at: Date.now(),
        };
        restoreCalls.push(call);
        if (fault === 'throw') {
          call.outcome = 'threw';
          throw new Error('injected restore failure');
        }
        if (fault === 'hang') {
          call.outcome = 'hung';
          return hang(context.signal, 'restore');
        }
        if (fault === 'unavailable') {
          call.outcome = 'refused NOT_FOUND';
          throw new StasisError('NOT_FOUND', 'injected: the checkpoint object is not in the store');
        }
        if (fault === 'hold') {
          call.outcome = 'held';
          await faults.gate;
        }
        try {
          const result = await local.restore(request, context);
          call.outcome = `restored from ${result.source}`;
          return result;
        } catch (err) {
          call.outcome = `refused ${(err as { code?: string }).code ?? String(err)}`;
          throw err;
        }
      },
      async release(request, context): Promise<SandboxReleaseReceipt> {
        const fault =
          faults.release ?? faults.releasePlan?.(request.sandboxId, attempts(faults.calls, request.sandboxId));
        const call: ProviderCall = {
          sandboxId: request.sandboxId,
          fence: request.fence,
          idempotencyKey: request.idempotencyKey,
          outcome: '',
          at: Date.now(),
        };
        faults.calls.push(call);
        if (fault === 'throw') {
          call.outcome = 'threw';
          throw new Error('injected release failure');
        }
        if (fault === 'hang') {
          call.outcome = 'hung';
          return hang(context.signal, 'release');
        }
        if (fault === 'not-released') {
          call.outcome = 'not-released';
          return {
            sandboxId: request.sandboxId,
            idempotencyKey: request.idempotencyKey,
            mode: request.mode,
            computeReleased: false,
            duplicate: false,
            fence: request.fence,
            releasedAt: new Date().toISOString(),
          };
        }
        // Real refusals of the real provider: the conditions are set up through the provider itself.
        if (fault === 'stale-fence')
          await local.attach({ sandboxId: request.sandboxId, fence: request.fence + 1 }, context);
        if (fault === 'idempotency-conflict') {
          await local.release(
            { ...request, mode: 'DETACH', reason: 'injected: an earlier, different request under the same key' },
            context,
          );
        }
        try {
          const receipt = await local.release(request, context);
          call.outcome = receipt.duplicate ? 'duplicate' : 'released';
          if (fault === 'no-checkpoint') {
            call.outcome += ' (checkpoint dropped)';
            const { checkpoint: _dropped, ...rest } = receipt;
            return rest;
          }
          return receipt;
        } catch (err) {
          call.outcome = `refused ${(err as { code?: string }).code ?? ''}`;
          throw err;
        }
      },
    };
  };
}

/** The provider's real checkpoint store, whose uploads fail as `faults.putPlan` says. */
function faultyStore(store: CheckpointStore, faults: ReleaseFaults): CheckpointStore {
  /** One put of either kind, numbered per sandbox for `faults.putPlan`. */
  const faulted = async (key: string, signal: AbortSignal | undefined, upload: () => Promise<Checkpoint>) => {
    const sandboxId = key.split('/')[1] ?? '';
    const putCalls = (faults.putCalls ??= []);
    const fault = faults.putPlan?.(sandboxId, putCalls.filter((c) => c.sandboxId === sandboxId).length + 1);
    const call: ProviderCall = { sandboxId, fence: -1, idempotencyKey: key, outcome: 'uploading', at: Date.now() };
    putCalls.push(call);
    const checkpoint = await upload();
    if (fault !== 'hang-after-upload') {
      call.outcome = 'uploaded';
      return checkpoint;
    }
    call.outcome = 'uploaded, answer held';
    await new Promise<void>((resolve) => {
      if (signal?.aborted) resolve();
      signal?.addEventListener('abort', () => resolve());
    });
    call.outcome = 'uploaded, answer lost';
    throw new Error(`put of ${key} cancelled after its upload`);
  };
  return {
    ...passThrough(store),
    put: (key, body, labels, signal) => faulted(key, signal, () => store.put(key, body, labels, signal)),
    putBytes: (key, bytes, labels, signal) => faulted(key, signal, () => store.putBytes(key, bytes, labels, signal)),
  };
}
