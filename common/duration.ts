// Durations are strings such as `30s`, `5m`, `2h`, `1d`. No zod here: workflow code reads them.
const UNIT_MS = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/** A duration's spelling: a count of 1 to 9 digits (no leading 0) and a unit. */
export const DURATION_RE = /^([1-9][0-9]{0,8})(s|m|h|d)$/;
export const DURATION_PROBLEM = 'must be a duration such as 30s, 5m, 2h or 1d';

export type Duration = string;

export function durationMs(duration: Duration): number {
  const match = DURATION_RE.exec(duration);
  if (!match) throw new Error(`invalid duration ${JSON.stringify(duration)}`);
  return Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS];
}
