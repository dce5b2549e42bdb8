import { patched, setCurrentDetails, upsertMemo, upsertSearchAttributes, workflowInfo } from '@temporalio/workflow';
import type { SearchAttributeUpdatePair } from '@temporalio/common';
import { labelKeywords } from '../common/labels';
import { PENDING_MEMO, pendingMemo, withRunLabels } from '../common/interactions';
import type { ExecutionResourceRecord, InteractionRequest } from '../common/schemas';
import { fitPendingMemo, pendingInteractions, type SessionAggregate } from './run-state';
import {
  StasisBlockedSince,
  StasisHostId,
  StasisKind,
  StasisLabels,
  StasisPendingInteractions,
  StasisProvider,
  StasisParentRunId,
  StasisResourceState,
  StasisStatus,
  SEARCH_ATTRIBUTE_KEYS,
} from './search-attributes';

// Keeps the search attributes and the current details of a workflow current, so
// operators filter and read Runs and sandboxes in Temporal Web. Only changed
// values are upserted, so history grows by one event per real change. The
// memory of what was published lives in each workflow's own Publisher: module
// state would be shared between workflows on a worker and break replay.

/** The Run's pending interactions go in its memo, so one visibility list finds them all (the approval page). */
export const PATCH_PENDING_MEMO = 'stasis-run-pending-memo';
/**
 * The memo of pending interactions is kept within run-state's PENDING_MEMO_MAX_BYTES (fitPendingMemo): it repeated
 * each interaction whole with the Run's labels, and with the Update's input and a webhook delivery's
 * in the same workflow task it passed gRPC's 4 MiB limit (the task failed, the ask got a bare 500).
 * In PATCH_RUN_BASELINE_4; a Run started before asks only when its memo is over the bound.
 */
export const PATCH_MEMO_FITS = 'stasis-run-memo-fits';

/**
 * One upsert per activation: what the workflow was started with counts as published, and the
 * upserts of one activation are merged into one (workflows/upsert-merge.ts). Histories recorded
 * before hold one upsert per change.
 */
export const PATCH_ONE_UPSERT = 'stasis-one-upsert-per-activation';

/** The attributes a Publisher keeps current: all but the labels, which are set once, at the start. */
const ALL_KEYS = SEARCH_ATTRIBUTE_KEYS.filter((key) => key !== StasisLabels);

const published = (value: unknown): string =>
  value instanceof Date ? value.toISOString() : JSON.stringify(value ?? null);

export class Publisher {
  private readonly published = new Map<string, string>();
  private details = '';
  private pendingIds = '';
  /**
   * Decided once, when the workflow starts (or replays its start); the marker (or a Run's baseline
   * that holds it) also turns the merging on.
   */
  private readonly gather: boolean;

  /** `isPatched`: patched() as the workflow decides it (a Run's baseline, workflows/run-controller.ts). */
  constructor(private readonly isPatched: (patchId: string) => boolean = patched) {
    this.gather = isPatched(PATCH_ONE_UPSERT);
    if (!this.gather) return;
    const started = workflowInfo().typedSearchAttributes;
    for (const key of ALL_KEYS) this.published.set(key.name, published(started.get(key)));
  }

  upsertChanged(pairs: SearchAttributeUpdatePair[]): void {
    const changed = pairs.filter((p) => {
      const value = published(p.value);
      if (this.published.get(p.key.name) === value) return false;
      this.published.set(p.key.name, value);
      return true;
    });
    if (changed.length > 0) upsertSearchAttributes(changed);
  }

  setDetails(text: string): void {
    if (text === this.details) return;
    this.details = text;
    setCurrentDetails(text);
  }

  run(run: SessionAggregate): void {
    publishRun(this, run);
  }

  /** Upserts the memo of pending interactions when the set changes (each one is fixed once asked). */
  pending(pending: InteractionRequest[]): void {
    const ids = pending.map((i) => i.id).join(',');
    if (ids === this.pendingIds) return;
    this.pendingIds = ids;
    if (!this.isPatched(PATCH_PENDING_MEMO)) return;
    const whole = pendingMemo(pending);
    const fitted = fitPendingMemo(pending, whole);
    // Asked only when the memo is over its bound, so other Runs record nothing new.
    upsertMemo({ [PENDING_MEMO]: fitted === whole || !this.isPatched(PATCH_MEMO_FITS) ? whole : fitted });
  }

  sandbox(view: { state: string; record: ExecutionResourceRecord }): void {
    publishSandbox(this, view);
  }
}

function recordPairs(record: ExecutionResourceRecord): SearchAttributeUpdatePair[] {
  return [
    { key: StasisResourceState, value: record.state },
    { key: StasisProvider, value: record.provider },
    { key: StasisHostId, value: record.hostId ?? null },
    { key: StasisBlockedSince, value: record.blockedSince ? new Date(record.blockedSince) : null },
  ];
}

/** A child Run publishes its labels itself; a Run a client starts has them from its start. */
export const PATCH_LABELS = 'stasis-run-labels';

function labelPairs(labels: Record<string, string> | undefined): SearchAttributeUpdatePair[] {
  const keywords = labelKeywords(labels);
  if (keywords.length === 0 || workflowInfo().typedSearchAttributes.get(StasisLabels) !== undefined) return [];
  return patched(PATCH_LABELS) ? [{ key: StasisLabels, value: keywords }] : [];
}

function publishRun(publisher: Publisher, run: SessionAggregate): void {
  const pending = pendingInteractions(run);
  publisher.pending(pending.map((i) => withRunLabels(i, run.spec.labels)));
  publisher.upsertChanged([
    { key: StasisKind, value: 'run' },
    { key: StasisStatus, value: run.status },
    { key: StasisPendingInteractions, value: pending.length },
    { key: StasisParentRunId, value: run.parentRunId ?? null },
    ...recordPairs(run.record),
    ...labelPairs(run.spec.labels),
  ]);
  const r = run.record;
  publisher.setDetails(
    [
      `**${run.status}** · phase ${run.phase}`,
      `sandbox \`${r.sandboxId}\` on ${r.hostId ?? '(no host)'} · ${r.state} · fence ${r.fence}` +
        (r.pauseMode ? ` · ${r.pauseMode}` : '') +
        (r.lastError ? ` · last error: ${r.lastError}` : ''),
      ...pending.map((i) => `waiting on ${i.id}: ${i.prompt}`),
      ...(run.children.length ? [`children: ${run.children.map((c) => `${c.runId} ${c.state}`).join(', ')}`] : []),
      ...(run.error ? [`error ${run.error.code}: ${run.error.message}`] : []),
    ].join('\n'),
  );
}

function publishSandbox(publisher: Publisher, view: { state: string; record: ExecutionResourceRecord }): void {
  publisher.upsertChanged([
    { key: StasisKind, value: 'sandbox' },
    { key: StasisStatus, value: view.state },
    ...recordPairs(view.record),
  ]);
  const r = view.record;
  publisher.setDetails(
    `**${view.state}** · \`${r.sandboxId}\` on ${r.hostId ?? '(no host)'} · ${r.state} · fence ${r.fence}` +
      (r.lastError ? ` · ${r.lastError}` : ''),
  );
}
