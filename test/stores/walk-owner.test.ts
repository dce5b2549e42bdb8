import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import fc from 'fast-check';
import { tempDir } from '../providers/helpers';
import { nest } from '../helpers/deep-tree';
import { walkDescribed } from '../helpers/walk-child';

// A worker that is not root (no sandbox volumes then, but `local` and `bwrap` still run) owns its
// sandboxes' files, as the sandbox runs as its uid, and reads them by their owner bits, which the
// sandbox may take away (`chmod 000` on a file or directory): every release of such a sandbox failed
// with EACCES, and every destroy as well (a read-only Go module cache is enough for that). The walk and
// the removal run here as `nobody` in a process of their own over trees `nobody` owns, with modes drawn
// at random: the walk must see what a root walk sees (every entry, mode and byte) and leave every mode
// as it was, and the removal must leave nothing.

const REPO = path.resolve(__dirname, '..', '..');
let home: string;

beforeAll(async () => {
  // swc, which compiles the sources for the child, keeps its binding in a cache of the user's own.
  home = await tempDir('walk-owner-home');
  execFileSync('chown', ['nobody', home]);
});

/** walk-child's `command` on `root` as `nobody`, in a process of its own. */
function asNobody(command: 'walk' | 'remove' | 'read' | 'write', ...args: string[]): Record<string, string> {
  const child = spawnSync(
    'setpriv',
    [
      '--reuid=nobody',
      '--regid=nogroup',
      '--clear-groups',
      process.execPath,
      '-r',
      path.join(REPO, 'scripts', 'register-ts.js'),
      path.join(REPO, 'test', 'helpers', 'walk-child.ts'),
      command,
      ...args,
    ],
    { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home }, encoding: 'utf8' },
  );
  if (child.status !== 0) throw new Error(`${command} as nobody failed: ${child.stderr}`);
  return JSON.parse(child.stdout) as Record<string, string>;
}

/** path → permission bits, by lstat, of everything under `root` (as root: whatever the modes). */
async function modes(root: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const relative of await fs.readdir(root, { recursive: true })) {
    out[String(relative)] = ((await fs.lstat(path.join(root, String(relative)))).mode & 0o7777).toString(8);
  }
  return out;
}

/**
 * `parent/sandbox`, filled by `fill` as root, then given with `parent` to nobody (as the sandbox's own files
 * are the worker's when it runs as nobody); `parent` is the worker's, searchable by nobody.
 */
async function nobodyOwned(prefix: string, fill: (root: string) => Promise<void> | void) {
  const parent = await tempDir(prefix);
  await fs.chmod(parent, 0o755);
  const root = path.join(parent, 'sandbox');
  await fs.mkdir(root);
  await fill(root);
  execFileSync('chown', ['-R', 'nobody:nogroup', parent]);
  return { parent, root };
}

const DIR_MODES = [0o000, 0o100, 0o200, 0o300, 0o400, 0o500, 0o700, 0o755];
const FILE_MODES = [0o000, 0o200, 0o400, 0o600, 0o644, 0o100];

interface Node {
  name: string;
  mode: number;
  children?: Node[];
}

const tree: fc.Arbitrary<Node[]> = fc.letrec<{ nodes: Node[]; node: Node }>((tie) => ({
  nodes: fc.uniqueArray(tie('node'), { maxLength: 4, selector: (node) => node.name }),
  node: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.record({ name: fc.stringMatching(/^[a-z]{1,6}$/), mode: fc.constantFrom(...FILE_MODES) }),
    fc.record({
      name: fc.stringMatching(/^[a-z]{1,6}$/),
      mode: fc.constantFrom(...DIR_MODES),
      children: tie('nodes'),
    }),
  ),
})).nodes;

/** Lays `nodes` out under `dir` (modes last, deepest first, so they do not stop the layout itself). */
async function layOut(dir: string, nodes: Node[]): Promise<void> {
  for (const node of nodes) {
    const where = path.join(dir, node.name);
    if (node.children) {
      await fs.mkdir(where);
      await layOut(where, node.children);
    } else await fs.writeFile(where, `${node.name} ${node.mode}\n`);
    await fs.chmod(where, node.mode);
  }
}

it('a worker that is not root walks the files its sandbox took its owner bits from, leaving every mode as it was, and removes them', async () => {
  await fc.assert(
    fc.asyncProperty(tree, tree, async (workspace, home) => {
      // The sandbox's directory, in one of the worker's own (as its data directory is).
      const { parent, root } = await nobodyOwned('walk-owner', async (root) => {
        for (const [name, nodes] of [
          ['workspace', workspace],
          ['home', home],
          ['envs', []],
        ] as const) {
          await fs.mkdir(path.join(root, name));
          await layOut(path.join(root, name), [...nodes]);
        }
      });
      const before = await modes(root);
      try {
        expect(asNobody('walk', root)).toEqual(await walkDescribed(root));
        expect(await modes(root)).toEqual(before);
        asNobody('remove', root);
        expect(await fs.readdir(parent)).toEqual([]);
      } finally {
        await fs.rm(parent, { recursive: true, force: true });
      }
    }),
    { numRuns: 12 },
  );
});

it('the file API of a worker that is not root refuses, naming the path, a file or directory whose mode refuses it, and changes nothing', async () => {
  const { parent, root: workspace } = await nobodyOwned('walk-owner-api', async (workspace) => {
    await fs.mkdir(path.join(workspace, 'ro'));
    await fs.writeFile(path.join(workspace, 'closed.txt'), 'closed\n');
    await fs.writeFile(path.join(workspace, 'ro', 'kept.txt'), 'kept\n');
    await fs.chmod(path.join(workspace, 'closed.txt'), 0o000);
    await fs.chmod(path.join(workspace, 'ro'), 0o555);
  });
  try {
    const before = await modes(workspace);
    for (const [command, file] of [
      // (A write of closed.txt replaces it in its writable directory, as the owner may: not refused.)
      ['read', 'closed.txt'],
      ['write', 'ro/kept.txt'],
      ['write', 'ro/new.txt'],
    ] as const) {
      const outcome = asNobody(command, workspace, file);
      expect(outcome.code).toBe('INVALID_ARGUMENT');
      expect(outcome.message).toContain(file);
    }
    expect(await modes(workspace)).toEqual(before);
    expect(await fs.readFile(path.join(workspace, 'ro', 'kept.txt'), 'utf8')).toBe('kept\n');
  } finally {
    await fs.rm(parent, { recursive: true, force: true });
  }
});

it('an entry whose set-group-ID bit a chmod by the worker would clear (its group not the worker’s) keeps its mode, the walk names it, and a removal still removes it', async () => {
  const { parent, root } = await nobodyOwned('walk-owner-sgid', async (root) => {
    for (const name of ['workspace', 'home', 'envs']) await fs.mkdir(path.join(root, name));
    await fs.writeFile(path.join(root, 'workspace', 'sg'), 'sg\n');
    await fs.mkdir(path.join(root, 'workspace', 'sgdir'));
    await fs.writeFile(path.join(root, 'workspace', 'sgdir', 'f'), 'f\n');
  });
  // Group root, which nobody is not in, as an inherited set-group-ID directory would give it.
  execFileSync('chown', ['nobody:root', path.join(root, 'workspace', 'sg'), path.join(root, 'workspace', 'sgdir')]);
  await fs.chmod(path.join(root, 'workspace', 'sg'), 0o2040);
  await fs.chmod(path.join(root, 'workspace', 'sgdir'), 0o2050);
  try {
    expect(() => asNobody('walk', root)).toThrow(/workspace\/sg: its mode refuses the worker/);
    expect(await modes(root)).toEqual({
      workspace: '755',
      'workspace/sg': '2040',
      'workspace/sgdir': '2050',
      'workspace/sgdir/f': '644',
      home: '755',
      envs: '755',
    });
    // Removed all the same (what its mode becomes on the way does not matter).
    asNobody('remove', root);
    expect(await fs.readdir(parent)).toEqual([]);
  } finally {
    await fs.rm(parent, { recursive: true, force: true });
  }
});

it('a worker that is not root removes a deep tree of read-only directories (moved up past 64 levels)', async () => {
  const { parent, root } = await nobodyOwned('walk-owner-deep', (root) => nest(root, 300, 0o555));
  try {
    asNobody('remove', root);
    expect(await fs.readdir(parent)).toEqual([]);
  } finally {
    await fs.rm(parent, { recursive: true, force: true });
  }
});
