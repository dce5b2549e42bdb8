import { readWorkspaceFile, removeTree, writeWorkspaceFile } from '../../providers/files';
import { readWhole, walkSandbox, type WalkEntry } from '../../stores/walk';

// Run by walk-owner.test.ts as another user: `walk <dir>` walks the sandbox tree there as a checkpoint
// does and prints what it saw (path → kind, mode and a file's contents) as one JSON object; `remove
// <dir>` removes it as a destroy does; `read`/`write <workspace> <path>` go through the file API.

/** What a walk entry says of its file: kind, permission bits, and a regular file's bytes. */
export function describeWalked(entry: WalkEntry): string {
  const mode = (Number(entry.stat.mode) & 0o7777).toString(8);
  if (entry.kind === 'file' && entry.file !== undefined)
    return `file ${mode} ${readWhole(entry.file, Number(entry.stat.size), entry.path).toString()}`;
  return `${entry.kind} ${mode}`;
}

/** Every entry of the tree at `root` as describeWalked says it. */
export async function walkDescribed(root: string): Promise<Record<string, string>> {
  const seen: Record<string, string> = {};
  for await (const entry of walkSandbox(root, ['workspace', 'home', 'envs'])) seen[entry.path] = describeWalked(entry);
  return seen;
}

/** What walk-child's `read <workspace> <path>` and `write <workspace> <path>` end with: the file or the error. */
async function fileAccess(command: string, workspace: string, file: string): Promise<Record<string, string>> {
  const done =
    command === 'read'
      ? readWorkspaceFile(workspace, file).then((bytes) => bytes.toString())
      : writeWorkspaceFile(workspace, file, Buffer.from('written\n')).then(() => 'written');
  return done.then(
    (outcome) => ({ outcome }),
    (err: { code?: string; message?: string }) => ({ code: String(err.code), message: String(err.message) }),
  );
}

if (require.main === module) {
  const [command, dir, file] = process.argv.slice(2);
  (command === 'remove'
    ? removeTree(dir).then(() => ({}))
    : command === 'walk'
      ? walkDescribed(dir)
      : fileAccess(command, dir, file)
  ).then(
    (seen) => process.stdout.write(JSON.stringify(seen)),
    (err: unknown) => {
      process.stderr.write(String(err));
      process.exit(1);
    },
  );
}
