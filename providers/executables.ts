import { accessSync, constants } from 'node:fs';
import * as path from 'node:path';

/** The first executable file `name` in `dirs` (relative ones skipped), or undefined. */
export function findExecutable(name: string, dirs: string[]): string | undefined {
  for (const dir of dirs.filter((d) => path.isAbsolute(d))) {
    const candidate = path.join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}
