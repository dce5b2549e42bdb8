import type { z } from 'zod';
import { describeIssues, StasisError } from '../common/errors';

// Request parts are parsed with the wire schemas; a failure is a 400 naming the
// field, e.g. `body.decision: Invalid option: expected one of "approve"|"deny"`.

interface Issue {
  path: PropertyKey[];
  message: string;
  code?: string;
  errors?: Issue[][];
}

/**
 * A union failure says only "Invalid input" at the union's path; name the
 * fields of the branch that came closest instead (each closest one when tied).
 */
function expandUnions(issues: Issue[]): string {
  return issues
    .map((issue) => {
      const branches = issue.code === 'invalid_union' ? (issue.errors ?? []).filter((b) => b.length > 0) : [];
      if (branches.length === 0) return describeIssues([issue]);
      const fewest = Math.min(...branches.map((b) => b.length));
      return branches
        .filter((b) => b.length === fewest)
        .map((b) => expandUnions(b.map((inner) => ({ ...inner, path: [...issue.path, ...inner.path] }))))
        .join(', or ');
    })
    .join('; ');
}

export function parseInput<S extends z.ZodType>(schema: S, value: unknown, where: string): z.infer<S> {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((issue) => ({ ...issue, path: [where, ...issue.path] }));
  throw new StasisError('INVALID_ARGUMENT', expandUnions(issues as Issue[]));
}
