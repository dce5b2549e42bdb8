import type {
  CreateSandboxInput,
  ExecutionResourceRecord,
  RunError,
  SandboxState,
  SandboxView,
} from '../common/schemas';
import type { Capabilities } from '../providers/api';
import type { SandboxFacts } from './lifecycle';

/** A standalone sandbox's durable state; continue-as-new carries it whole. */
export interface SandboxAggregate {
  sandboxId: string;
  create: CreateSandboxInput;
  createdAt: string;
  state: SandboxState;
  record: ExecutionResourceRecord;
  capabilities?: Capabilities;
  /** Suspended past retention: every call but destroy gets STALE_SANDBOX_ROUTE. */
  expired: boolean;
  suspendedAtMs?: number;
  lastActivityMs: number;
  ttlDeadlineMs?: number;
  error?: RunError;
}

export function toSandboxView(s: SandboxAggregate): SandboxView {
  return {
    sandboxId: s.sandboxId,
    state: s.state,
    provider: s.create.provider,
    ...(s.record.hostId ? { hostId: s.record.hostId } : {}),
    createdAt: s.createdAt,
    ...(s.create.policy ? { policy: s.create.policy } : {}),
    record: s.record,
    ...(s.error ? { error: s.error } : {}),
    ...(s.create.labels ? { labels: s.create.labels } : {}),
  };
}

export function sandboxFacts(
  s: SandboxAggregate,
  changing: boolean,
  runningExecs: number,
  fileOps: number,
): SandboxFacts {
  return { state: s.state, changing, runningExecs, fileOps, expired: s.expired };
}
