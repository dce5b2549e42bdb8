import { setCurrentDetails, upsertSearchAttributes } from '@temporalio/workflow';
import type { SearchAttributeUpdatePair } from '@temporalio/common';
import type { ExecutionResourceRecord } from '../common/schemas';
import { pendingInteractions, type SessionAggregate } from './run-state';
import {
  StasisBlockedSince,
  StasisHostId,
  StasisKind,
  StasisPendingInteractions,
  StasisProvider,
  StasisParentRunId,
  StasisResourceState,
  StasisStatus,
} from './search-attributes';

// Keeps the search attributes and the current details of a workflow current, so
// operators filter and read Runs and sandboxes in Temporal Web. Only changed
// values are upserted, so history grows by one event per real change. The
// memory of what was published lives in each workflow's own Publisher: module
// state would be shared between workflows on a worker and break replay.

export class Publisher {
  private readonly published = new Map<string, string>();
  private details = '';

  upsertChanged(pairs: SearchAttributeUpdatePair[]): void {
    const changed = pairs.filter((p) => {
      const value = p.value instanceof Date ? p.value.toISOString() : JSON.stringify(p.value ?? null);
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

function publishRun(publisher: Publisher, run: SessionAggregate): void {
  const pending = pendingInteractions(run);
  publisher.upsertChanged([
    { key: StasisKind, value: 'run' },
    { key: StasisStatus, value: run.status },
    { key: StasisPendingInteractions, value: pending.length },
    { key: StasisParentRunId, value: run.parentRunId ?? null },
    ...recordPairs(run.record),
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
  publisher.upsertChanged([{ key: StasisKind, value: 'sandbox' }, { key: StasisStatus, value: view.state }, ...recordPairs(view.record)]);
  const r = view.record;
  publisher.setDetails(`**${view.state}** · \`${r.sandboxId}\` on ${r.hostId ?? '(no host)'} · ${r.state} · fence ${r.fence}` + (r.lastError ? ` · ${r.lastError}` : ''));
}
