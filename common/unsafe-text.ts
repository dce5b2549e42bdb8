// Which characters of text an agent or a remote caller chose are shown escaped (`\uXXXX`), never
// as they are: the one home of that set, for the CLI's terminalSafe and the approval page (which
// gets it from the server as /unsafe-text.js, web/assets.ts). Free of Node APIs.

/**
 * C0 controls (newline and CR too), DEL, C1 controls, and the bidi overrides and isolates
 * (U+202A–U+202E, U+2066–U+2069): they move a terminal's cursor or rewrite its lines, or reorder
 * what is shown (Trojan Source, CVE-2021-42574), so what a person reads is not what runs.
 */
export const UNSAFE_TEXT_CLASS = '[\\u0000-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]';

/** A fresh global RegExp of UNSAFE_TEXT_CLASS. */
export function unsafeTextPattern(): RegExp {
  return new RegExp(UNSAFE_TEXT_CLASS, 'g');
}

/** How an unsafe character is shown: `\u` and its four hex digits. */
export function escapedChar(c: string): string {
  return `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
}
