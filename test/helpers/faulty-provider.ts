import type { ProviderDeps, SandboxProvider, SandboxReleaseReceipt } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { StasisError } from '../../common/errors';

/** Faults a test switches on and off while Runs use the `faulty` provider. */
export interface ReleaseFaults {
  /** `throw`: release fails; `not-released`: a receipt with computeReleased false; `hang`: never answers. */
  release?: 'throw' | 'not-released' | 'hang';
  /** Operations that answer SANDBOX_FAILED (a sandbox broken beyond repair). */
  broken?: ('exec' | 'stop' | 'pause')[];
  /** Every release request the provider saw, in order. */
  calls: { fence: number; idempotencyKey: string; outcome: string }[];
}

/**
 * The real `local` provider (real processes and files) under the name `faulty`,
 * whose release can be made to fail the ways a provider fails in production.
 */
export function faultyProvider(faults: ReleaseFaults) {
  return (deps: ProviderDeps): SandboxProvider => {
    const local = createLocalProvider(deps, { name: 'faulty' });
    const breakable = (op: 'exec' | 'stop' | 'pause') => {
      if (faults.broken?.includes(op)) throw new StasisError('SANDBOX_FAILED', `injected: sandbox broke during ${op}`);
    };
    return {
      ...local,
      async exec(request, context) {
        breakable('exec');
        return local.exec(request, context);
      },
      async stop(request, context) {
        breakable('stop');
        return local.stop(request, context);
      },
      async pause(request, context) {
        breakable('pause');
        return local.pause(request, context);
      },
      async release(request, context): Promise<SandboxReleaseReceipt> {
        const fault = faults.release;
        if (fault === 'throw') {
          faults.calls.push({ fence: request.fence, idempotencyKey: request.idempotencyKey, outcome: 'threw' });
          throw new Error('injected release failure');
        }
        if (fault === 'hang') {
          faults.calls.push({ fence: request.fence, idempotencyKey: request.idempotencyKey, outcome: 'hung' });
          await new Promise<void>((resolve) => context.signal?.addEventListener('abort', () => resolve()));
          throw new Error('hung release cancelled');
        }
        if (fault === 'not-released') {
          faults.calls.push({ fence: request.fence, idempotencyKey: request.idempotencyKey, outcome: 'not-released' });
          return { sandboxId: request.sandboxId, idempotencyKey: request.idempotencyKey, mode: request.mode, computeReleased: false, duplicate: false, fence: request.fence, releasedAt: new Date().toISOString() };
        }
        try {
          const receipt = await local.release(request, context);
          faults.calls.push({ fence: request.fence, idempotencyKey: request.idempotencyKey, outcome: 'released' });
          return receipt;
        } catch (err) {
          faults.calls.push({ fence: request.fence, idempotencyKey: request.idempotencyKey, outcome: `refused ${(err as { code?: string }).code ?? ''}` });
          throw err;
        }
      },
    };
  };
}
