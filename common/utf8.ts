import { parseJsonText } from './wire-json';
// Bytes that must be UTF-8 text (a JSON request body, a JSON file the CLI reads) are decoded
// strictly: a byte sequence that is not UTF-8 is refused, never turned into U+FFFD, so what a caller
// sent is what is recorded or run, or nothing is. Not imported by workflow code.

/** Fatal: throws on bytes that are not UTF-8. Keeps a leading byte order mark, for the caller to judge. */
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** `bytes` as text, or undefined when they are not UTF-8. */
export function decodeUtf8(bytes: Uint8Array): string | undefined {
  try {
    return STRICT_UTF8.decode(bytes);
  } catch {
    return undefined;
  }
}

/** Why bytes that are not UTF-8 are refused, under `at` (e.g. `body: not valid UTF-8 ...`). */
export const notUtf8 = (at: string): string =>
  `${at}: not valid UTF-8 (JSON text must be UTF-8; a byte sequence that is not UTF-8 is never replaced)`;

/**
 * JSON text in `bytes` by the rules every surface shares (parseJsonText), refused first if it is not
 * UTF-8: a REST body, a RunSpec file. Problems are named under `at`.
 */
export function parseJsonBytes(bytes: Uint8Array, at: string): ReturnType<typeof parseJsonText> {
  const text = decodeUtf8(bytes);
  return text === undefined ? { problem: notUtf8(at) } : parseJsonText(text, at);
}
