import { resolveAccepts } from '../common/interactions';
import { escapedChar, unsafeTextPattern } from '../common/unsafe-text';
import type { InteractionRequest, RunSnapshot, SandboxPage, SandboxView } from '../common/schemas';

// Human renderings of the wire types, shared by the commands. Text an agent or a
// remote caller chose goes through `terminalSafe`, words of a command to paste
// through `shellWord`.

// C0 controls (newline and CR too), DEL, C1 controls, the bidi overrides and isolates, and the
// invisible characters: the set the approval page escapes too (common/unsafe-text.ts).
const UNSAFE_FOR_TERMINAL = unsafeTextPattern();

/**
 * Text made safe to print on a terminal: each unsafe character is shown as `\uXXXX` (an astral one
 * as `\u{XXXXX}`), so an agent's text cannot move the cursor, rewrite lines, set the title or the
 * clipboard (ANSI/OSC escapes), start a line of its own, reorder what is shown (bidi overrides), or
 * hide a character in what is shown (a zero-width space after a file name, a tag character).
 */
export function terminalSafe(text: string): string {
  return text.replace(UNSAFE_FOR_TERMINAL, escapedChar);
}

/** One word for a POSIX shell: bare when it has no special characters, single-quoted otherwise. */
export function shellWord(word: string): string {
  if (/^[A-Za-z0-9._/:=@%+,-]+$/.test(word)) return word;
  // Inside single quotes nothing is special but the quote itself: end, an escaped quote, reopen.
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

export function ago(iso: string): string {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

export function interactionLine(runId: string, i: InteractionRequest): string {
  const head = `  ${terminalSafe(i.id)}  ${i.status}  ${i.kind}  ${terminalSafe(JSON.stringify(i.prompt))}  (asked ${ago(i.createdAt)})`;
  if (i.status === 'pending') return `${head}\n    answer: ${terminalSafe(answerCommand(runId, i))}`;
  return i.respondedBy
    ? `${head} by ${terminalSafe(i.respondedBy)}: ${terminalSafe(JSON.stringify(i.response))}`
    : head;
}

/**
 * The `stasis approve` command that answers an interaction, with the answers it accepts; a person
 * pastes it into a shell, so each word an agent chose is quoted for the shell.
 */
function answerCommand(runId: string, i: InteractionRequest): string {
  const accepts = resolveAccepts(i);
  const parts = [
    accepts.includes('input') ? (accepts.length === 1 ? '--input <text>' : '[--input <text>]') : undefined,
    accepts.includes('deny') ? '[--deny]' : undefined,
    accepts.includes('edit') ? '[--edit-command <command>]' : undefined,
    accepts.includes('option') ? `[--option ${(i.options ?? []).map(shellWord).join('|')}]` : undefined,
  ].filter((p) => p !== undefined);
  return ['stasis approve', shellWord(runId), shellWord(i.id), ...parts].join(' ');
}

export function runText(run: RunSnapshot): string {
  const lines = [`${terminalSafe(run.runId)}  ${run.status}`];
  if (run.parentRunId) lines.push(`  parent: ${terminalSafe(run.parentRunId)}`);
  if (run.childRunIds.length > 0) lines.push(`  children: ${terminalSafe(run.childRunIds.join(', '))}`);
  for (const i of run.interactions) lines.push(interactionLine(run.runId, i));
  if (run.output !== undefined) lines.push(`  output: ${terminalSafe(JSON.stringify(run.output))}`);
  if (run.error) lines.push(`  error: ${errorText(run.error)}`);
  return lines.join('\n');
}

/** A refusal or failure as `CODE: message`; both may come from an agent or a remote server. */
export function errorText(error: { code: string; message: string }): string {
  return terminalSafe(`${error.code}: ${error.message}`);
}

export function sandboxText(sandbox: SandboxView): string {
  const where = sandbox.hostId ? ` on ${sandbox.hostId}` : '';
  const lines = [terminalSafe(`${sandbox.sandboxId}  ${sandbox.state}  (${sandbox.provider}${where})`)];
  if (sandbox.record.checkpoint)
    lines.push(
      `  checkpoint: ${terminalSafe(sandbox.record.checkpoint.uri)} (${bytes(sandbox.record.checkpoint.bytes)})`,
    );
  if (sandbox.error) lines.push(`  error: ${errorText(sandbox.error)}`);
  return lines.join('\n');
}

export function sandboxListText(page: SandboxPage): string {
  const lines = page.sandboxes.map((s) => {
    const labels = Object.entries(s.labels).map(([key, value]) => `${key}:${value}`);
    const where = s.hostId ? ` on ${s.hostId}` : '';
    return terminalSafe(
      `${s.sandboxId}  ${s.state}  (${s.provider ?? '?'}${where})${labels.length ? `  ${labels.join(' ')}` : ''}`,
    );
  });
  if (lines.length === 0) lines.push('no sandboxes');
  if (page.nextPageToken) lines.push(`more: --page-token ${shellWord(terminalSafe(page.nextPageToken))}`);
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
