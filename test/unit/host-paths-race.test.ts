import { mkdirSync, mkdtempSync, realpathSync, symlinkSync } from 'node:fs';
import fsPromises from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { resolveOnHost } from '../../common/host-paths';

// Many sandboxes asking for workspaces under one new parent at once (the bench's waiting Runs): the
// parent may appear between the check's realpath (not there) and its lstat (there), and that is no
// dangling symlink. The fault is injected at that point; a real dangling symlink is still refused.

// fsPromises: the module object itself (a default import; `import * as` makes a copy), which common/host-paths.ts calls through.
const root = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'host-paths-race-')));

afterEach(() => jest.restoreAllMocks());

test('a parent another sandbox creates while a workspace below it is resolved resolves', async () => {
  const parent = path.join(root, 'parent');
  const lstat = fsPromises.lstat;
  jest.spyOn(fsPromises, 'lstat').mockImplementation(async (at, ...rest) => {
    if (at === parent) mkdirSync(path.join(parent, 'other'), { recursive: true }); // the neighbour's mkdir lands here
    return lstat(at, ...(rest as [])) as never;
  });
  await expect(resolveOnHost(path.join(parent, 'mine', 'deeper'))).resolves.toBe(path.join(parent, 'mine', 'deeper'));
});

test('a dangling symlink on the way is still refused', async () => {
  symlinkSync(path.join(root, 'nowhere'), path.join(root, 'dangling'));
  await expect(resolveOnHost(path.join(root, 'dangling', 'w'))).rejects.toThrow(/dangling symlink/);
});
