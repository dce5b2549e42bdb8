import { execFileSync } from 'node:child_process';

/** Makes `depth` nested directories `a` under `root`, with a file every 100 levels and at the bottom. */
export function nest(root: string, depth: number, mode = 0o755): void {
  const script = [
    'import os, sys',
    'os.chdir(sys.argv[1])',
    'for i in range(int(sys.argv[2])):',
    '    os.mkdir("a")',
    '    if i % 100 == 0: open("f", "w").write("level %d" % i)',
    '    os.chdir("a")',
    'open("bottom", "w").write("bottom")',
    'for i in range(int(sys.argv[2])):',
    '    os.chdir("..")',
    '    os.chmod("a", int(sys.argv[3], 8))',
  ].join('\n');
  execFileSync('python3', ['-c', script, root, String(depth), mode.toString(8)]);
}
