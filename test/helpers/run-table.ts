import type { RunPhase, RunStatus } from '../../common/schemas';

// The Run's transitions written out independently of the product's RUN_TRANSITIONS,
// so tests check the rules rather than restate them. Key: `status/phase/event`.

export const RUN_EVENTS = [
  'ask',
  'answered',
  'suspend',
  'suspended',
  'resume',
  'resumed',
  'resumeSkipped',
  'complete',
  'fail',
  'cancel',
  'expire',
] as const;
export const STATUSES: RunStatus[] = ['RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'CANCELLED', 'EXPIRED'];
export const PHASES: RunPhase[] = ['ACTIVE', 'SUSPENDING', 'SUSPENDED', 'RESUMING'];

const live = ['RUNNING', 'WAITING'] as const;
const legal: Record<string, string> = {
  'RUNNING/ACTIVE/ask': 'WAITING/ACTIVE',
  // An agent whose resume is deferred to its next action asks with the sandbox not back yet.
  'RUNNING/RESUMING/ask': 'WAITING/RESUMING',
  'RUNNING/ACTIVE/complete': 'COMPLETED/ACTIVE',
};
for (const s of live) {
  legal[`${s}/ACTIVE/suspend`] = `${s}/SUSPENDING`;
  legal[`${s}/SUSPENDING/suspended`] = `${s}/SUSPENDED`;
  legal[`${s}/SUSPENDED/resume`] = `${s}/RESUMING`;
  legal[`${s}/RESUMING/resumed`] = `${s}/ACTIVE`;
  // A deferred resume given up: the sandbox stays released for the next suspension.
  legal[`${s}/RESUMING/resumeSkipped`] = `${s}/SUSPENDING`;
  for (const p of PHASES) {
    legal[`${s}/${p}/fail`] = 'FAILED/ACTIVE';
    legal[`${s}/${p}/cancel`] = 'CANCELLED/ACTIVE';
    legal[`${s}/${p}/expire`] = 'EXPIRED/ACTIVE';
  }
}
for (const p of PHASES) legal[`WAITING/${p}/answered`] = `RUNNING/${p}`;

/** `status/phase/event` → `status/phase` after it; absent keys are illegal. */
export const RUN_LEGAL = legal;
