import type { ProviderDeps, SandboxProvider, SandboxReleaseReceipt } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';

/** Faults a test switches on and off while Runs use the `faulty` provider. */
export interface ReleaseFaults {
  /** `throw`: release fails; `not-released`: a receipt with computeReleased false; `hang`: never answers. */
  release?: 'throw' | 'not-released' | 'hang';
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
    return {
      ...local,
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
