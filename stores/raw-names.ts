// Names are bytes on Linux (any but `/` and NUL); checkpoints name entries with JS strings. A name's
// bytes become a string as Python's "surrogateescape" does: decoded as UTF-8 where they are valid
// UTF-8, and each byte of a sequence that is not becomes the lone surrogate U+DC00 + byte (U+DC80 to
// U+DCFF: only bytes from 0x80 up are ever escaped, as every byte below is valid UTF-8 alone). Valid
// UTF-8 never decodes to a lone surrogate, so the mapping is one to one, a valid name is the very
// string Node gives for it, and JSON keeps lone surrogates (as `\udcXX` escapes). A string whose
// bytes would not decode back to it (a lone surrogate outside U+DC80..U+DCFF, or escapes of bytes that
// form valid UTF-8, or of a byte below 0x80) is no name this module made: isRawName refuses it.
// Node's fs encodes a string path as UTF-8 (a lone surrogate as EF BF BD): a path holding an escape
// is handed to fs as its bytes (fsPath).

import { hasLoneSurrogate } from '../common/wire-json';

/** Whether `text` holds a lone surrogate (an escaped byte, or anything else no UTF-8 spells). */
export const hasEscapes: (text: string) => boolean = hasLoneSurrogate;

/** The string of a name's (or a path's, or a symlink target's) bytes: UTF-8, each byte of an invalid sequence escaped. */
export function nameFromBytes(bytes: Uint8Array): string {
  const buffer = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const text = buffer.toString('utf8');
  // U+FFFD: invalid bytes were replaced (or the name spells U+FFFD itself); decoded again byte by byte.
  return text.includes('\uFFFD') ? decodeEscaping(buffer) : text;
}

/** The bytes a string of nameFromBytes stands for: UTF-8, escapes back to their bytes. */
export function bytesOfName(text: string): Buffer {
  if (!hasEscapes(text)) return Buffer.from(text, 'utf8');
  const out: number[] = [];
  for (let i = 0; i < text.length; i += 1) {
    const c = text.charCodeAt(i);
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 0x3f));
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length && isLow(text.charCodeAt(i + 1))) {
      const point = 0x10000 + ((c - 0xd800) << 10) + (text.charCodeAt(i + 1) - 0xdc00);
      i += 1;
      out.push(
        0xf0 | (point >> 18),
        0x80 | ((point >> 12) & 0x3f),
        0x80 | ((point >> 6) & 0x3f),
        0x80 | (point & 0x3f),
      );
    } else if (c >= 0xdc80 && c <= 0xdcff) out.push(c - 0xdc00);
    // Any other lone surrogate is no escape: written as UTF-8 would have it (isRawName refuses such a string).
    else out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
  }
  return Buffer.from(out);
}

/**
 * Whether `text` is what nameFromBytes makes of some bytes: no lone surrogate but escapes of bytes
 * that do not decode as UTF-8 where they stand. A manifest may hold anything; this is what it may name.
 */
export function isRawName(text: string): boolean {
  return !hasEscapes(text) || nameFromBytes(bytesOfName(text)) === text;
}

/** A path for Node's fs: the string itself, or its bytes when it holds an escape (fs would write it as U+FFFD). */
export function fsPath(text: string): string | Buffer {
  return hasEscapes(text) ? bytesOfName(text) : text;
}

/** `text` with each escaped byte shown as `\xNN`, for messages. */
export function shownName(text: string): string {
  return hasEscapes(text)
    ? text.replace(/\p{Cs}/gu, (c) => `\\x${(c.charCodeAt(0) & 0xff).toString(16).padStart(2, '0')}`)
    : text;
}

function isLow(c: number): boolean {
  return c >= 0xdc00 && c <= 0xdfff;
}

function isCont(byte: number | undefined): boolean {
  return byte !== undefined && (byte & 0xc0) === 0x80;
}

/** Strict UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF); each other byte escaped alone. */
function decodeEscaping(bytes: Buffer): string {
  let out = '';
  let i = 0;
  while (i < bytes.length) {
    const b0 = bytes[i];
    if (b0 < 0x80) {
      out += String.fromCharCode(b0);
      i += 1;
      continue;
    }
    const b1 = bytes[i + 1];
    const b2 = bytes[i + 2];
    const b3 = bytes[i + 3];
    if (b0 >= 0xc2 && b0 <= 0xdf && isCont(b1)) {
      out += String.fromCharCode(((b0 & 0x1f) << 6) | (b1 & 0x3f));
      i += 2;
      continue;
    }
    if (b0 >= 0xe0 && b0 <= 0xef && isCont(b1) && isCont(b2)) {
      const point = ((b0 & 0x0f) << 12) | ((b1 & 0x3f) << 6) | (b2 & 0x3f);
      if (point >= 0x800 && (point < 0xd800 || point > 0xdfff)) {
        out += String.fromCharCode(point);
        i += 3;
        continue;
      }
    }
    if (b0 >= 0xf0 && b0 <= 0xf4 && isCont(b1) && isCont(b2) && isCont(b3)) {
      const point = ((b0 & 0x07) << 18) | ((b1 & 0x3f) << 12) | ((b2 & 0x3f) << 6) | (b3 & 0x3f);
      if (point >= 0x10000 && point <= 0x10ffff) {
        out += String.fromCodePoint(point);
        i += 4;
        continue;
      }
    }
    out += String.fromCharCode(0xdc00 + b0);
    i += 1;
  }
  return out;
}
