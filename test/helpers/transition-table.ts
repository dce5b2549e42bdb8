import type { SandboxState } from '../../common/schemas';

// The sandbox transition table (docs/DESIGN.md, Sandboxes), written out independently of the
// product's SANDBOX_TRANSITIONS so tests check the rules rather than restate them.

export const USER_OPS = ['start', 'stop', 'pause', 'resume', 'suspend', 'destroy'] as const;
export type UserOp = (typeof USER_OPS)[number];

export const LEGAL: Record<string, SandboxState> = {
  'created/start': 'running',
  'created/destroy': 'destroyed',
  'running/stop': 'stopped',
  'running/pause': 'paused',
  'running/suspend': 'suspended',
  'running/destroy': 'destroyed',
  'stopped/start': 'running',
  'stopped/destroy': 'destroyed',
  'paused/resume': 'running',
  'paused/destroy': 'destroyed',
  'suspended/resume': 'running',
  'suspended/destroy': 'destroyed',
  'failed/destroy': 'destroyed',
  'lost/destroy': 'destroyed',
};

/** A repeated suspend or resume answers with the current state. */
export const IDEMPOTENT = new Set(['suspended/suspend', 'running/resume']);
