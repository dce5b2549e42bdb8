import { randomUUID } from 'node:crypto';
import * as path from 'node:path';
import type { PauseMode, RunSpec, StepShape } from '../common/schemas';
import { fillCommand, MiB } from './workspace';

// The Runs the bench starts: the scripted cycle of the issue,
// `exec → ask → (suspend) → respond → (resume) → exec → complete`, per pause mode.

export interface ModeCase {
  /** Label in the report. */
  name: string;
  mode: PauseMode;
  /** Bytes the first exec writes into the workspace. */
  bytes: number;
}

/** DETACH, TERMINATE, and SNAPSHOT_AND_TERMINATE with a 1 MiB and a `largeMiB` workspace. */
export function modeCases(largeMiB: number): ModeCase[] {
  return [
    { name: 'DETACH', mode: 'DETACH', bytes: 1 * MiB },
    { name: 'TERMINATE', mode: 'TERMINATE', bytes: 1 * MiB },
    { name: 'SNAPSHOT_AND_TERMINATE 1 MiB', mode: 'SNAPSHOT_AND_TERMINATE', bytes: 1 * MiB },
    { name: `SNAPSHOT_AND_TERMINATE ${largeMiB} MiB`, mode: 'SNAPSHOT_AND_TERMINATE', bytes: largeMiB * MiB },
  ];
}

export function newRunId(prefix: string): string {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/** DETACH by policy; TERMINATE through an active (host-persistent) workspace; SNAPSHOT_AND_TERMINATE for an isolated one (the default). */
export function sandboxFor(mode: PauseMode, runId: string, scratch: string): Pick<RunSpec, 'sandbox' | 'policy'> {
  if (mode === 'DETACH') return { sandbox: { provider: 'local' }, policy: { pauseMode: 'DETACH' } };
  if (mode === 'TERMINATE')
    return {
      sandbox: { provider: 'local', workspace: { kind: 'active', hostPath: path.join(scratch, 'active', runId) } },
    };
  return { sandbox: { provider: 'local' } };
}

/** `exec (fill) → (ask → exec) × cycles → complete`. */
export function cycleSpec(runId: string, c: ModeCase, scratch: string, cycles = 1): RunSpec {
  const steps: StepShape[] = [{ exec: fillCommand(c.bytes) }];
  for (let i = 1; i <= cycles; i++) steps.push({ ask: `Continue (${i})?` }, { exec: `echo cycle ${i} >> cycles.txt` });
  steps.push({ complete: 'done' });
  return {
    runId,
    agent: { driver: 'scripted', steps },
    ...sandboxFor(c.mode, runId, scratch),
    labels: { bench: c.name },
  };
}
