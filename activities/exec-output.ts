import type { ExecOutcome } from '../providers/api';

// An exec result travels through Temporal history (and, for a Run, through its
// agent's next step and continue-as-new). Temporal refuses payloads over 2 MiB,
// (and warns over 512 KiB), so each stream is cut to its last EXEC_OUTPUT_LIMIT_BYTES: the end of a
// command's output is what says how it ended.

/** Largest stdout, and largest stderr, an exec result carries. */
export const EXEC_OUTPUT_LIMIT_BYTES = 128 * 1024;

/** `text` if it fits in `limit` bytes (UTF-8); otherwise a note and its last `limit` bytes. */
export function keepTail(text: string, limit = EXEC_OUTPUT_LIMIT_BYTES, droppedBefore = 0): string {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= limit && droppedBefore === 0) return text;
  let start = Math.max(0, bytes.length - limit);
  // Never start inside a UTF-8 sequence (continuation bytes are 10xxxxxx).
  while (start < bytes.length && (bytes[start] & 0xc0) === 0x80) start += 1;
  const dropped = droppedBefore + start;
  return `[stasis: output truncated: the first ${dropped} bytes were dropped, the last ${bytes.length - start} kept]\n${bytes.subarray(start).toString('utf8')}`;
}

/** An exec outcome whose streams fit a Temporal payload. */
export function boundExecOutcome<T extends ExecOutcome>(outcome: T): T {
  return { ...outcome, stdout: keepTail(outcome.stdout), stderr: keepTail(outcome.stderr) };
}

/**
 * What an exec's activity returns: the outcome within a payload, or with `keepOutput: false` (a job
 * whose output its owner throws away, a Run's background job) its exit code alone, its streams empty,
 * so that nothing is recorded in the owner's history for it.
 */
export function execActivityResult<T extends ExecOutcome>(outcome: T, keepOutput?: boolean): T {
  return keepOutput === false ? { ...outcome, stdout: '', stderr: '' } : boundExecOutcome(outcome);
}
