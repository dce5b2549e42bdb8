// The cursor of a page of pending interactions: where the page ended, in their
// order (oldest first), opaque to callers.

/** [createdAt, runId, interactionId] of the last interaction of a page. */
export type Cursor = [string, string, string];

export const compareCursors = (a: Cursor, b: Cursor): number => {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
};

export const encodeCursor = (cursor: Cursor): string => Buffer.from(JSON.stringify(cursor)).toString('base64url');

/** The cursor `text` encodes, or null when it is not one. */
export function decodeCursor(text: string): Cursor | null {
  try {
    const value: unknown = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'));
    if (Array.isArray(value) && value.length === 3 && value.every((v) => typeof v === 'string')) return value as Cursor;
  } catch {
    // not JSON: not a cursor
  }
  return null;
}
