import { resolveAccepts } from '../common/interactions';
import type { InteractionRequest, RunSnapshot, SandboxPage, SandboxView } from '../common/schemas';

// Human renderings of the wire types, shared by the commands.

export function ago(iso: string): string {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

export function interactionLine(runId: string, i: InteractionRequest): string {
  const head = `  ${i.id}  ${i.status}  ${i.kind}  ${JSON.stringify(i.prompt)}  (asked ${ago(i.createdAt)})`;
  if (i.status === 'pending') return `${head}\n    answer: stasis approve ${runId} ${i.id}${answerHint(i)}`;
  return i.respondedBy ? `${head} by ${i.respondedBy}: ${JSON.stringify(i.response)}` : head;
}

/** The options of `stasis approve` that give the answers an interaction accepts. */
function answerHint(i: InteractionRequest): string {
  const accepts = resolveAccepts(i);
  const parts = [
    accepts.includes('input') ? (accepts.length === 1 ? '--input <text>' : '[--input <text>]') : undefined,
    accepts.includes('deny') ? '[--deny]' : undefined,
    accepts.includes('edit') ? '[--edit-command <command>]' : undefined,
    accepts.includes('option') ? `[--option ${(i.options ?? []).map((o) => JSON.stringify(o)).join('|')}]` : undefined,
  ].filter((p) => p !== undefined);
  return parts.map((p) => ` ${p}`).join('');
}

export function runText(run: RunSnapshot): string {
  const lines = [`${run.runId}  ${run.status}`];
  if (run.parentRunId) lines.push(`  parent: ${run.parentRunId}`);
  if (run.childRunIds.length > 0) lines.push(`  children: ${run.childRunIds.join(', ')}`);
  for (const i of run.interactions) lines.push(interactionLine(run.runId, i));
  if (run.output !== undefined) lines.push(`  output: ${JSON.stringify(run.output)}`);
  if (run.error) lines.push(`  error: ${run.error.code}: ${run.error.message}`);
  return lines.join('\n');
}

export function sandboxText(sandbox: SandboxView): string {
  const where = sandbox.hostId ? ` on ${sandbox.hostId}` : '';
  const lines = [`${sandbox.sandboxId}  ${sandbox.state}  (${sandbox.provider}${where})`];
  if (sandbox.record.checkpoint)
    lines.push(`  checkpoint: ${sandbox.record.checkpoint.uri} (${bytes(sandbox.record.checkpoint.bytes)})`);
  if (sandbox.error) lines.push(`  error: ${sandbox.error.code}: ${sandbox.error.message}`);
  return lines.join('\n');
}

export function sandboxListText(page: SandboxPage): string {
  const lines = page.sandboxes.map((s) => {
    const labels = Object.entries(s.labels).map(([key, value]) => `${key}:${value}`);
    const where = s.hostId ? ` on ${s.hostId}` : '';
    return `${s.sandboxId}  ${s.state}  (${s.provider ?? '?'}${where})${labels.length ? `  ${labels.join(' ')}` : ''}`;
  });
  if (lines.length === 0) lines.push('no sandboxes');
  if (page.nextPageToken) lines.push(`more: --page-token ${page.nextPageToken}`);
  return lines.join('\n');
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let value = n / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}
