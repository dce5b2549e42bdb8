// Sizes that bound what travels inside one Temporal payload. Kept free of zod so
// workflow code can import them.

/**
 * Largest JSON input (a RunSpec, a sandbox create, an exec, an answer), whatever the surface: the
 * REST body limit, and checked by the typed client before it reaches Temporal, whose payloads
 * must stay under 2 MiB (an exec's input and result both travel in the sandbox's history).
 */
export const JSON_INPUT_LIMIT_BYTES = 1024 * 1024;

/** The length of `text` in UTF-8 bytes, without Buffer (workflow code uses it too). */
export function utf8Length(text: string): number {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (unit < 0x80) bytes += 1;
    else if (unit < 0x800) bytes += 2;
    else if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        bytes += 4; // a surrogate pair: one code point
        i += 1;
      } else bytes += 3;
    } else bytes += 3;
  }
  return bytes;
}

/** Why `value` is too large as JSON input (PAYLOAD_TOO_LARGE's message), or undefined. */
export function inputTooLarge(what: string, value: unknown): string | undefined {
  const bytes = utf8Length(JSON.stringify(value) ?? '');
  return bytes > JSON_INPUT_LIMIT_BYTES
    ? `${what}: must be at most ${JSON_INPUT_LIMIT_BYTES} bytes as JSON (is ${bytes})`
    : undefined;
}

/** Largest file the sandbox file routes carry through a Temporal payload (base64 inside an Update). */
export const FILE_LIMIT_BYTES = 1024 * 1024;

/**
 * The most UTF-8 bytes of JSON Stasis puts in one payload of its own that may hold caller or agent
 * content (a file read, continue-as-new's input, an answered interaction, a webhook's input): well
 * under Temporal's 2 MiB payload limit (over it Temporal fails the workflow task or terminates the
 * workflow), with room for the rest of the payload.
 */
export const PAYLOAD_MAX_BYTES = 1536 * 1024;

/**
 * The most UTF-8 bytes of payloads Stasis puts in the commands of one workflow task (Update results,
 * activity inputs). A task's completion travels as one gRPC message, which Temporal refuses past
 * 4 MB; the worker then sent the same completion again and again, and the workflow was stuck for
 * good (seven execs of 128 KiB of control characters each, ending together). One payload (at most
 * PAYLOAD_MAX_BYTES) always goes, so the total stays under 4 MB.
 */
export const TASK_PAYLOADS_MAX_BYTES = 2560 * 1024;

/** Whether a payload of `bytes` may join the `used` bytes a workflow task already put in its commands. */
export const fitsInTask = (used: number, bytes: number): boolean =>
  used === 0 || used + bytes <= TASK_PAYLOADS_MAX_BYTES;

/** UTF-8 bytes of a value as JSON: what Temporal's JSON payload converter sends. */
export const jsonBytes = (value: unknown): number => utf8Length(JSON.stringify(value ?? null));

/**
 * Largest a file read's contents may be as they travel: JSON text in a Temporal payload, base64
 * for the sandbox file routes (a file of FILE_LIMIT_BYTES is 1.33 MiB so) and the text with its
 * JSON escapes for a Run's readFile. Ordinary text grows little, but a control character is six
 * bytes as JSON (`\u0001`) and a byte that is not UTF-8 three (U+FFFD): 400 KB of U+0001 is 2.4 MB,
 * past Temporal's 2 MiB payload limit.
 */
export const FILE_CARRY_LIMIT_BYTES = PAYLOAD_MAX_BYTES;
