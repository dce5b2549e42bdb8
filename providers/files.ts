import { constants } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { StasisError } from '../common/errors';
import { hasErrorCode } from '../stores/atomic-file';

// File access to a sandbox's workspace from outside it. A path (relative, or
// absolute under /workspace as commands inside bubblewrap see it) must stay in
// the workspace, also once every symlink on the way is followed.

/** Largest file readFile hands back in one piece. */
export const MAX_FILE_BYTES = 64 * 1024 * 1024;

export async function readWorkspaceFile(workspace: string, requested: string): Promise<Buffer> {
  const file = await resolveInside(workspace, requested);
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    throw fileError(err, requested);
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw new StasisError('INVALID_ARGUMENT', `path ${requested}: not a regular file`);
    if (stat.size > MAX_FILE_BYTES) {
      throw new StasisError(
        'PAYLOAD_TOO_LARGE',
        `path ${requested}: ${stat.size} bytes is more than ${MAX_FILE_BYTES}`,
      );
    }
    return await handle.readFile();
  } finally {
    await handle.close();
  }
}

export async function writeWorkspaceFile(workspace: string, requested: string, content: Buffer): Promise<void> {
  const file = await resolveInside(workspace, requested);
  await fs.mkdir(path.dirname(file), { recursive: true });
  // The parent was created through real directories only; check again in case a link appeared meanwhile.
  await resolveInside(workspace, requested);
  try {
    await fs.writeFile(file, content, {
      flag: constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW,
    });
  } catch (err) {
    throw fileError(err, requested);
  }
}

/**
 * The real path `requested` names inside `workspace`: the final component may
 * not exist yet, but every existing part is resolved and must stay inside.
 */
async function resolveInside(workspace: string, requested: string): Promise<string> {
  const relative = requested.startsWith('/workspace/') ? requested.slice('/workspace/'.length) : requested;
  if (relative === '' || path.isAbsolute(relative) || relative.includes('\0')) {
    throw new StasisError('INVALID_ARGUMENT', `path ${JSON.stringify(requested)}: must be relative to the workspace`);
  }
  const root = await fs.realpath(workspace);
  const lexical = path.resolve(root, relative);
  assertInside(root, lexical, requested);
  // Resolve the deepest existing ancestor (or the file itself) and re-attach the missing tail.
  let existing = lexical;
  const missing: string[] = [];
  for (;;) {
    try {
      const real = await fs.realpath(existing);
      const resolved = path.join(real, ...missing);
      assertInside(root, resolved, requested);
      if (resolved === root)
        throw new StasisError('INVALID_ARGUMENT', `path ${JSON.stringify(requested)}: names the workspace itself`);
      return resolved;
    } catch (err) {
      if (!hasErrorCode(err, 'ENOENT')) throw err;
      missing.unshift(path.basename(existing));
      existing = path.dirname(existing);
    }
  }
}

function assertInside(root: string, candidate: string, requested: string): void {
  const relative = path.relative(root, candidate);
  if (relative === '..' || relative.startsWith(`..${path.sep}`) || path.isAbsolute(relative)) {
    throw new StasisError('INVALID_ARGUMENT', `path ${JSON.stringify(requested)}: escapes the workspace`);
  }
}

function fileError(err: unknown, requested: string): Error {
  if (hasErrorCode(err, 'ENOENT'))
    return new StasisError('NOT_FOUND', `path ${requested}: no such file in the workspace`);
  if (hasErrorCode(err, 'EISDIR')) return new StasisError('INVALID_ARGUMENT', `path ${requested}: is a directory`);
  if (hasErrorCode(err, 'ELOOP'))
    return new StasisError(
      'INVALID_ARGUMENT',
      `path ${requested}: is a symlink that cannot be followed inside the workspace`,
    );
  return err instanceof Error ? err : new Error(String(err));
}
