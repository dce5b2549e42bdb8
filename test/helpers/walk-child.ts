import { removeTree } from '../../providers/files';
import { readWhole, walkSandbox, type WalkEntry } from '../../stores/walk';

// Run by walk-owner.test.ts as another user: `walk <dir>` walks the sandbox tree there as a checkpoint
// does and prints what it saw (path → kind, mode and a file's contents) as one JSON object; `remove
// <dir>` removes it as a destroy does.

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

if (require.main === module) {
  const [command, dir] = process.argv.slice(2);
  (command === 'remove' ? removeTree(dir).then(() => ({})) : walkDescribed(dir)).then(
    (seen) => process.stdout.write(JSON.stringify(seen)),
    (err: unknown) => {
      process.stderr.write(String(err));
      process.exit(1);
    },
  );
}
