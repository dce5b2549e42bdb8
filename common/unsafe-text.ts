// Which characters of text an agent or a remote caller chose are shown escaped (`\uXXXX`), never
// as they are: the one home of that set, for the CLI's terminalSafe and the approval page (which
// gets it from the server as /unsafe-text.js, web/assets.ts). Free of Node APIs.

/**
 * C0 controls (newline and CR too), DEL, C1 controls, and the bidi overrides and isolates
 * (U+202A–U+202E, U+2066–U+2069): they move a terminal's cursor or rewrite its lines, or reorder
 * what is shown (Trojan Source, CVE-2021-42574), so what a person reads is not what runs.
 *
 * And the characters that show as nothing, or as a blank, or break a line that is no `\n`: so
 * `./build\u200b` does not read as `./build`, nor `--env=prod\u2060` as `--env=prod`. Soft hyphen
 * U+00AD, combining grapheme joiner U+034F, Arabic letter mark U+061C, Hangul fillers U+115F,
 * U+1160, U+3164, U+FFA0, Mongolian vowel separator U+180E, zero-width space, joiners and the
 * LRM/RLM marks U+200B–U+200F, line and paragraph separators U+2028–U+2029, word joiner, invisible
 * operators and the deprecated format characters U+2060–U+206F, BOM U+FEFF, interlinear annotation
 * U+FFF9–U+FFFB, and the tag characters U+E0000–U+E007F (invisible text a model reads: "ASCII
 * smuggling"). An emoji's ZWJ or tags are shown escaped too: a command is read, not decorated.
 *
 * And the variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF), which show as nothing after any
 * character: 256 of them spell any bytes ("emoji smuggling"), and one after a name makes another
 * name (`./build\u{e0100}` is not `./build`). Only the one selector an emoji takes is left as it
 * is: U+FE0E or U+FE0F right after an emoji character (`❤️`, a keycap `1️⃣`); a second one, or one
 * after anything else, is escaped.
 *
 * One character per match (the selector's rule looks at the character before it). Astral (the tags,
 * the selectors): build the RegExp with UNSAFE_TEXT_FLAGS.
 */
export const UNSAFE_TEXT_PATTERN =
  '[\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u034f\\u061c\\u115f\\u1160\\u180e\\u200b-\\u200f\\u2028-\\u202e' +
  '\\u2060-\\u206f\\u3164\\ufe00-\\ufe0d\\ufeff\\uffa0\\ufff9-\\ufffb\\u{e0000}-\\u{e007f}\\u{e0100}-\\u{e01ef}]' +
  '|(?<!\\p{Emoji})[\\ufe0e\\ufe0f]';

/** The flags UNSAFE_TEXT_PATTERN needs: `u`, so an astral character is one code point, not two halves (and `\p{…}` works). */
export const UNSAFE_TEXT_FLAGS = 'u';

/** A fresh global RegExp of UNSAFE_TEXT_PATTERN. */
export function unsafeTextPattern(): RegExp {
  // Each joiner and combining mark of the class is meant on its own: it is what is matched.
  // eslint-disable-next-line no-misleading-character-class
  return new RegExp(UNSAFE_TEXT_PATTERN, `${UNSAFE_TEXT_FLAGS}g`);
}

/** How an unsafe character is shown: `\u` and its four hex digits, or `\u{…}` for an astral one. */
export function escapedChar(c: string): string {
  const code = c.codePointAt(0)!;
  const hex = code.toString(16);
  return code > 0xffff ? `\\u{${hex}}` : `\\u${hex.padStart(4, '0')}`;
}
