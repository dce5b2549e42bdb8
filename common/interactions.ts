// The rules of a structured interaction (README, "Approvals"): which answers it
// accepts, and whether an answer fits it. Plain functions over plain data, so the
// wire schemas, the drivers and the workflow (which validates answers) share them.

/** The kinds of answer a person can give. */
export const ANSWER_KINDS = ['approve', 'deny', 'edit', 'input', 'option'] as const;
export type AnswerKind = (typeof ANSWER_KINDS)[number];

/** What an interaction says about the answers it takes. */
export interface InteractionAnswerSpec {
  kind?: 'approval' | 'input';
  options?: readonly string[];
  accepts?: readonly AnswerKind[];
}

/**
 * The answers an interaction accepts: its own list, or the default of its kind —
 * approve/deny for an approval, input for an input, plus option when it has options.
 */
export function resolveAccepts(spec: InteractionAnswerSpec): AnswerKind[] {
  if (spec.accepts) return [...spec.accepts];
  const base: AnswerKind[] = (spec.kind ?? 'approval') === 'approval' ? ['approve', 'deny'] : ['input'];
  return spec.options?.length ? [...base, 'option'] : base;
}

/** Why an interaction's fields do not fit together, with the field to name; undefined when they do. */
export function interactionSpecProblem(spec: InteractionAnswerSpec): { field: string; message: string } | undefined {
  const accepts = spec.accepts;
  if (!accepts) return undefined;
  if (accepts.includes('option') && !spec.options?.length) {
    return { field: 'accepts', message: '"option" needs options to choose from' };
  }
  if (accepts.includes('edit') && (spec.kind ?? 'approval') !== 'approval') {
    return { field: 'accepts', message: '"edit" is an answer to an approval, not to an input' };
  }
  return undefined;
}

/** The kind of an answer (assumed well-formed). */
export function answerKind(response: unknown): AnswerKind | undefined {
  if (typeof response !== 'object' || response === null) return undefined;
  const r = response as Record<string, unknown>;
  if (r.decision === 'approve' || r.decision === 'deny' || r.decision === 'edit') return r.decision;
  if ('input' in r) return 'input';
  if ('option' in r) return 'option';
  return undefined;
}

/** Why `response` is not an answer this interaction accepts (the field to name is in the message); undefined when it is. */
export function answerProblem(interaction: InteractionAnswerSpec, response: unknown): string | undefined {
  const accepts = resolveAccepts(interaction);
  const kind = answerKind(response);
  if (!kind || !accepts.includes(kind)) {
    return `response: the answer "${kind ?? 'unknown'}" is not accepted here; this interaction accepts ${accepts.join(', ')}`;
  }
  if (kind === 'option') {
    const option = (response as { option: string }).option;
    if (!interaction.options?.includes(option)) {
      return `response.option: ${JSON.stringify(option)} is not one of the options (${(interaction.options ?? []).map((o) => JSON.stringify(o)).join(', ')})`;
    }
  }
  return undefined;
}

/**
 * An interaction as the surfaces show it: with the Run's labels (the snapshot, the memo of pending
 * interactions, the respond Update's answer, webhooks). A Run keeps its labels once, in its spec, not
 * in each interaction: copied into each one they made every interaction as large as the labels (up to
 * the 1 MiB input limit), and continue-as-new too large for Temporal. They go where the copy went
 * (before `createdAt`), so what the surfaces show is as it was, byte for byte. An interaction that has
 * labels of its own (asked before) or a Run without labels: unchanged.
 */
export function withRunLabels<I extends { labels?: Record<string, string> }>(
  interaction: I,
  labels: Record<string, string> | undefined,
): I {
  if (interaction.labels !== undefined || !labels || Object.keys(labels).length === 0) return interaction;
  const out: Record<string, unknown> = {};
  let placed = false;
  for (const [key, value] of Object.entries(interaction)) {
    if (key === 'createdAt' && !placed) {
      out.labels = labels;
      placed = true;
    }
    out[key] = value;
  }
  if (!placed) out.labels = labels;
  return out as I;
}

/** An interaction without a copy of the Run's labels (what a Run keeps and carries). */
export function withoutLabels<I extends { labels?: Record<string, string> }>(interaction: I): I {
  if (interaction.labels === undefined) return interaction;
  const { labels: _labels, ...rest } = interaction;
  return rest as I;
}

/** The memo key under which a Run keeps its pending interactions, for listing them through visibility. */
export const PENDING_MEMO = 'stasisPendingInteractions';
/** Longest diff a memo carries: memos stay small; the Run's snapshot has the whole diff. */
export const MEMO_DIFF_CHARS = 32_768;

/** What the memo of pending interactions holds: each interaction, its diff cut to MEMO_DIFF_CHARS (and marked so). */
export function pendingMemo<I extends { action?: { diff?: string } }>(pending: I[]): (I & { diffTruncated?: true })[] {
  return pending.map((i) =>
    i.action?.diff !== undefined && i.action.diff.length > MEMO_DIFF_CHARS
      ? { ...i, action: { ...i.action, diff: i.action.diff.slice(0, MEMO_DIFF_CHARS) }, diffTruncated: true as const }
      : i,
  );
}
