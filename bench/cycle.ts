import * as path from 'node:path';
import type { PauseMode } from '../common/schemas';
import { createLocalProvider } from '../providers/local';
import type { RequestContext, SandboxProvider } from '../providers/api';
import type { BenchEnv } from './env';
import { breakdown, find, timedHistory, type Breakdown, type TimedEvent } from './history';
import { cycleSpec, modeCases, newRunId, type ModeCase } from './specs';
import { summarize, sleep, timed, type Summary } from './stats';
import { StasisResourceState, StasisStatus } from '../workflows/search-attributes';
import { fillCommand } from './workspace';

// Figure 1: suspend and resume latency of one scripted cycle per pause mode,
// from the Run's history, against the same provider calls made directly.

export interface CycleSample {
  runId: string;
  /** Agent's ask answered by the driver (agentStep completed, or its local-activity marker) → workflow task that recorded RELEASED completed. */
  suspendMs: number;
  /** Respond update accepted → first job after resume started (execInSandbox, or the fused resumeAndExecInSandbox, started). */
  resumeMs: number;
  /** Time inside the provider: releaseSandbox / restoreSandbox or attach activity run time. */
  suspendProviderMs: number;
  resumeProviderMs: number;
  /** Client side: executeUpdate round trip of respond. */
  respondCallMs: number;
  suspendBreakdown: Breakdown;
  resumeBreakdown: Breakdown;
}

export interface ModeResult {
  name: string;
  mode: PauseMode;
  bytes: number;
  suspendMs: Summary;
  resumeMs: Summary;
  respondCallMs: Summary;
  baselineSuspendMs: Summary;
  baselineResumeMs: Summary;
  suspendOverheadMs: number;
  resumeOverheadMs: number;
  suspendRatio: number;
  resumeRatio: number;
  /** Median of each breakdown component over the samples. */
  suspendParts: Record<string, number>;
  resumeParts: Record<string, number>;
  errors: string[];
}

/**
 * Polls the Run's search attributes as the server holds them (describe: no visibility lag, and no
 * worker involved). Not by query: a query that reaches the Run while its local agent step runs ends
 * that workflow task early, so polling every 25 ms added a workflow task to the very suspension
 * being measured.
 */
async function waitReleased(env: BenchEnv, runId: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const described = await env.temporal.workflow
      .getHandle(runId)
      .describe()
      .catch(() => undefined);
    const state = described?.typedSearchAttributes.get(StasisResourceState);
    if (state === 'RELEASED' && described?.typedSearchAttributes.get(StasisStatus) === 'WAITING') return;
    if (Date.now() > deadline)
      throw new Error(`run ${runId} not RELEASED after ${timeoutMs} ms (last ${state ?? 'unknown'})`);
    await sleep(25);
  }
}

export function analyseCycle(events: TimedEvent[]): Omit<CycleSample, 'runId' | 'respondCallMs'> {
  const releaseScheduled = find(events, (e) => e.type === 'ActivityTaskScheduled' && e.activity === 'releaseSandbox');
  const askAnswered = [...events]
    .reverse()
    .find(
      (e) =>
        e.id < releaseScheduled.id &&
        ((e.type === 'ActivityTaskCompleted' && e.activity === 'agentStep') ||
          (e.type === 'MarkerRecorded' && e.activity === 'local activity')),
    );
  if (!askAnswered) throw new Error('no agent step before the release');
  const releaseDone = find(events, (e) => e.type === 'ActivityTaskCompleted' && e.scheduledId === releaseScheduled.id);
  const recorded = find(events, (e) => e.type === 'WorkflowTaskCompleted', releaseDone.id);
  const accepted = find(events, (e) => e.type === 'WorkflowExecutionUpdateAccepted');
  // A resume fused with its job (resumeAndExecInSandbox) ends where that activity starts: the restore in it is provider time.
  const firstJob = find(
    events,
    (e) =>
      e.type === 'ActivityTaskStarted' && (e.activity === 'execInSandbox' || e.activity === 'resumeAndExecInSandbox'),
    accepted.id,
  );
  const suspendBreakdown = breakdown(events, askAnswered.id, recorded.id);
  const resumeBreakdown = breakdown(events, accepted.id, firstJob.id);
  return {
    suspendMs: recorded.timeMs - askAnswered.timeMs,
    resumeMs: firstJob.timeMs - accepted.timeMs,
    suspendProviderMs: suspendBreakdown.activityRunMs.releaseSandbox ?? 0,
    resumeProviderMs:
      (resumeBreakdown.activityRunMs.restoreSandbox ?? 0) + (resumeBreakdown.activityRunMs.sandboxOp ?? 0),
    suspendBreakdown,
    resumeBreakdown,
  };
}

async function stasisCycle(env: BenchEnv, c: ModeCase): Promise<CycleSample> {
  const runId = newRunId(`cyc-${c.mode.toLowerCase().slice(0, 4)}`);
  await env.client.runs.start(cycleSpec(runId, c, env.scratch));
  await waitReleased(env, runId, 120_000);
  const respond = await timed(() => env.client.runs.respond(runId, 'int-1', { decision: 'approve' }));
  await env.temporal.workflow.getHandle(runId).result();
  const events = await timedHistory(env.temporal, runId);
  return { runId, respondCallMs: respond.ms, ...analyseCycle(events) };
}

/** The same provider operations without Temporal: release, then attach / re-provision / restore. */
async function baselineCycle(
  provider: SandboxProvider,
  c: ModeCase,
  scratch: string,
  i: number,
  hostId: string,
): Promise<{ suspendMs: number; resumeMs: number }> {
  const sandboxId = `base-${c.mode.toLowerCase().slice(0, 4)}-${c.bytes}-${i}`;
  const ctx: RequestContext = { ownerId: sandboxId, hostId };
  const workspace =
    c.mode === 'TERMINATE'
      ? { kind: 'active' as const, hostPath: path.join(scratch, 'baseline-active', sandboxId) }
      : { kind: 'isolated' as const };
  await provider.provision({ sandboxId, fence: 1, workspace }, ctx);
  await provider.start({ sandboxId, fence: 1 }, ctx);
  await provider.exec({ sandboxId, fence: 1, jobId: 'job-1', command: fillCommand(c.bytes) }, ctx);
  // Under fences of their own, as a Run's release and resume are (coordinator.ts): a raised fence is written
  // to the sandbox's state before the call answers, part of the provider's work (a DETACH release at the
  // fence it was started with writes nothing but its receipt).
  const release = await timed(() =>
    provider.release(
      { sandboxId, fence: 2, idempotencyKey: `${sandboxId}/2/release`, mode: c.mode, reason: 'INTERACTION' },
      ctx,
    ),
  );
  const resume = await timed(async () => {
    if (c.mode === 'DETACH') await provider.attach({ sandboxId, fence: 3 }, ctx);
    else
      await provider.restore(
        {
          sandboxId,
          fence: 3,
          workspace,
          ...(release.value.checkpoint ? { checkpoint: release.value.checkpoint } : {}),
        },
        ctx,
      );
  });
  await provider.exec({ sandboxId, fence: 3, jobId: 'job-2', command: 'true' }, ctx);
  await provider.destroy({ sandboxId, fence: 3 }, ctx);
  return { suspendMs: release.ms, resumeMs: resume.ms };
}

function medianParts(samples: Breakdown[]): Record<string, number> {
  const keys = new Set<string>(['workflowTaskQueueMs', 'workflowTaskRunMs', 'otherMs']);
  for (const s of samples) {
    for (const k of Object.keys(s.activityQueueMs)) keys.add(`queue:${k}`);
    for (const k of Object.keys(s.activityRunMs)) keys.add(`run:${k}`);
  }
  const pick = (s: Breakdown, key: string): number => {
    if (key.startsWith('queue:')) return s.activityQueueMs[key.slice(6)] ?? 0;
    if (key.startsWith('run:')) return s.activityRunMs[key.slice(4)] ?? 0;
    return s[key as 'workflowTaskQueueMs' | 'workflowTaskRunMs' | 'otherMs'];
  };
  return Object.fromEntries([...keys].map((k) => [k, summarize(samples.map((s) => pick(s, k))).median]));
}

export async function runCycleBench(
  env: BenchEnv,
  reps: number,
  largeMiB: number,
  log: (line: string) => void,
  /** `modes`: only these cases (a profile script); `baselineHost`: the direct provider's host id. */
  options: { modes?: string[]; baselineHost?: string } = {},
): Promise<ModeResult[]> {
  // Configured as the worker's provider (sandbox volumes included), so the difference is orchestration alone.
  const provider = createLocalProvider({
    hostId: options.baselineHost ?? 'bench-baseline',
    dataDir: path.join(env.scratch, 'baseline'),
    store: env.store,
    volumes: env.config.STASIS_SANDBOX_VOLUMES,
  });
  const results: ModeResult[] = [];
  for (const c of modeCases(largeMiB).filter((m) => !options.modes || options.modes.includes(m.name))) {
    const samples: CycleSample[] = [];
    const base: { suspendMs: number; resumeMs: number }[] = [];
    const errors: string[] = [];
    // One warm-up of each (bundle caches, first upload), not counted; then alternate Temporal and direct.
    await stasisCycle(env, c).catch((err: unknown) => errors.push(`warm-up: ${String(err)}`));
    await baselineCycle(provider, c, env.scratch, 0, options.baselineHost ?? 'bench-baseline').catch((err: unknown) =>
      errors.push(`baseline warm-up: ${String(err)}`),
    );
    for (let i = 1; i <= reps; i++) {
      try {
        samples.push(await stasisCycle(env, c));
      } catch (err) {
        errors.push(String(err));
      }
      try {
        base.push(await baselineCycle(provider, c, env.scratch, i, options.baselineHost ?? 'bench-baseline'));
      } catch (err) {
        errors.push(`baseline: ${String(err)}`);
      }
    }
    const suspendMs = summarize(samples.map((s) => s.suspendMs));
    const resumeMs = summarize(samples.map((s) => s.resumeMs));
    const baselineSuspendMs = summarize(base.map((b) => b.suspendMs));
    const baselineResumeMs = summarize(base.map((b) => b.resumeMs));
    const result: ModeResult = {
      name: c.name,
      mode: c.mode,
      bytes: c.bytes,
      suspendMs,
      resumeMs,
      respondCallMs: summarize(samples.map((s) => s.respondCallMs)),
      baselineSuspendMs,
      baselineResumeMs,
      suspendOverheadMs: Math.round(suspendMs.median - baselineSuspendMs.median),
      resumeOverheadMs: Math.round(resumeMs.median - baselineResumeMs.median),
      suspendRatio: Math.round((suspendMs.median / Math.max(0.1, baselineSuspendMs.median)) * 10) / 10,
      resumeRatio: Math.round((resumeMs.median / Math.max(0.1, baselineResumeMs.median)) * 10) / 10,
      suspendParts: medianParts(samples.map((s) => s.suspendBreakdown)),
      resumeParts: medianParts(samples.map((s) => s.resumeBreakdown)),
      errors,
    };
    log(
      `cycle ${c.name}: suspend ${suspendMs.median} ms (direct ${baselineSuspendMs.median}; releaseSandbox run ${result.suspendParts['run:releaseSandbox'] ?? 0}), resume ${resumeMs.median} ms (direct ${baselineResumeMs.median})` +
        (errors.length ? `; ${errors.length} errors: ${errors[0]}` : ''),
    );
    results.push(result);
  }
  await provider.close();
  return results;
}
