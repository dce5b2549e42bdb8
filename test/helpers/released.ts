import { mkdtempSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { TestStack } from './stack';

/** A command that runs until `release` exists in the sandbox's workspace (releaseAll). */
export const UNTIL_RELEASED = 'while [ ! -e release ]; do sleep 0.1; done';

/** Workspaces whose long commands end at releaseAll. */
const workspaces: string[] = [];

/** A started sandbox whose active workspace is a fresh directory of this host: commands in it can wait for `release`. */
export async function startedInDir(stack: TestStack): Promise<{ sandboxId: string; dir: string }> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'history-room-'));
  workspaces.push(dir);
  const { sandboxId } = await stack.client.sandboxes.create({
    provider: 'local',
    workspace: { kind: 'active', hostPath: dir },
  });
  await stack.client.sandboxes.start(sandboxId);
  return { sandboxId, dir };
}

/** Ends every command waiting on `release` (call it after each test, passed or failed). */
export function releaseAll(): void {
  for (const dir of workspaces.splice(0)) writeFileSync(path.join(dir, 'release'), '');
}
