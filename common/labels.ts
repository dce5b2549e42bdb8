// Labels as the StasisLabels search attribute holds them: `key:value` keywords. Kept
// free of zod, because workflow code publishes them too.

/**
 * How many characters the keywords may take together. Temporal caps one search attribute
 * value at 2 KiB by default (limit.searchAttributesSizeOfValue); this leaves room for the
 * JSON quoting.
 */
export const LABELS_MAX_CHARS = 1_600;

/**
 * The labels as StasisLabels keywords, in order, while they fit LABELS_MAX_CHARS.
 * A key holding ":" would make `key:value` ambiguous: such a label is not published.
 */
export function labelKeywords(labels: Record<string, string> | undefined): string[] {
  const keywords: string[] = [];
  let chars = 0;
  for (const [key, value] of Object.entries(labels ?? {})) {
    if (key.length === 0 || key.includes(':')) continue;
    const keyword = `${key}:${value}`;
    if (chars + keyword.length > LABELS_MAX_CHARS) break;
    chars += keyword.length;
    keywords.push(keyword);
  }
  return keywords;
}
