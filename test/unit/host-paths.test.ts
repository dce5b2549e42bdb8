import { mkdirSync, mkdtempSync, realpathSync, symlinkSync } from 'node:fs';
import { mkdir, realpath } from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import fc from 'fast-check';
import { checkHostPath, isWithin, type HostPathPolicy } from '../../common/host-paths';

// Active workspaces only under STASIS_HOST_PATHS: the attacks of a caller who
// may name any host path, against a real directory tree with real symlinks.

const root = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'host-paths-')));
const ok = path.join(root, 'ok');
const dataDir = path.join(root, 'data');
for (const dir of ['ok/sub', 'ok-evil', 'outside', 'data/hosts', 'ok/inner-data'])
  mkdirSync(path.join(root, dir), { recursive: true });
symlinkSync(path.join(root, 'outside'), path.join(ok, 'link-out'));
symlinkSync('/', path.join(ok, 'link-root'));
symlinkSync(path.join(ok, 'sub'), path.join(ok, 'link-in'));
symlinkSync(path.join(root, 'nowhere'), path.join(ok, 'dangling'));
symlinkSync(dataDir, path.join(ok, 'link-data'));
symlinkSync('..', path.join(ok, 'sub', 'up'));
// A prefix reached through a symlink.
symlinkSync(ok, path.join(root, 'ok-alias'));

const policy: HostPathPolicy = { allowed: [ok], dataDir };
const FIELD = 'body.sandbox.workspace.hostPath';

async function verdict(hostPath: string, with_: HostPathPolicy = policy): Promise<string> {
  try {
    await checkHostPath(hostPath, with_, FIELD);
    return 'allowed';
  } catch (err) {
    const { code, message } = err as { code?: string; message: string };
    expect(code).toBe('INVALID_ARGUMENT');
    expect(message.startsWith(`${FIELD}: `)).toBe(true);
    return 'refused';
  }
}

test.each([
  ['the prefix itself', ok],
  ['a directory under it', path.join(ok, 'sub')],
  ['a new directory under it', path.join(ok, 'new', 'deeper')],
  ['a symlink that stays under it', path.join(ok, 'link-in', 'x')],
])('allowed: %s', async (_what, hostPath) => {
  expect(await verdict(hostPath)).toBe('allowed');
});

test.each([
  ['/', '/'],
  ['/ spelled with ..', `${ok}/../../../../../../..`],
  ['outside every prefix', path.join(root, 'outside')],
  ['a prefix-sibling (/srv/ok-evil for /srv/ok)', path.join(root, 'ok-evil', 'x')],
  // `..` after a symlink goes up from its target: any `..` is refused, even one that seems to stay.
  ['a `..` that seems to stay under it', `${ok}/sub/../sub2`],
  ['.. out of the prefix', `${ok}/../outside`],
  ['.. out of the prefix, deeper', `${ok}/sub/../../ok-evil`],
  ['a symlink out of the prefix', path.join(ok, 'link-out')],
  ['a new directory below a symlink out', path.join(ok, 'link-out', 'new')],
  ['a symlink to /', path.join(ok, 'link-root', 'etc')],
  ['a dangling symlink (mkdir would follow it anywhere)', path.join(ok, 'dangling', 'x')],
  ['a symlinked `..` out of the prefix', `${ok}/sub/up/../outside`],
  ['the data dir', dataDir],
  ['inside the data dir', path.join(dataDir, 'hosts')],
  ['the data dir through a symlink under the prefix', path.join(ok, 'link-data', 'hosts')],
  ['a relative path', 'ok/sub'],
  ['a NUL byte', `${ok}/sub\0/x`],
])('refused: %s', async (_what, hostPath) => {
  expect(await verdict(hostPath)).toBe('refused');
});

test('a directory above the data dir is refused, and the data dir under a prefix is too', async () => {
  const inner: HostPathPolicy = { allowed: [ok], dataDir: path.join(ok, 'inner-data') };
  expect(await verdict(ok, inner)).toBe('refused');
  expect(await verdict(path.join(ok, 'inner-data', 'x'), inner)).toBe('refused');
  expect(await verdict(path.join(ok, 'sub'), inner)).toBe('allowed');
});

test('unset STASIS_HOST_PATHS allows nothing; a prefix reached through a symlink still binds', async () => {
  expect(await verdict(path.join(ok, 'sub'), { allowed: [], dataDir })).toBe('refused');
  const viaAlias: HostPathPolicy = { allowed: [path.join(root, 'ok-alias')], dataDir };
  expect(await verdict(path.join(root, 'ok-alias', 'sub'), viaAlias)).toBe('allowed');
  expect(await verdict(path.join(root, 'ok-alias', 'link-out'), viaAlias)).toBe('refused');
  expect(await verdict(`${root}/ok-alias/../outside`, viaAlias)).toBe('refused');
});

test('whatever path a caller builds, one that is allowed ends up, once created, under the prefix and off the data dir', async () => {
  const segments = [
    'ok',
    'ok-evil',
    'outside',
    'sub',
    'link-out',
    'link-root',
    'link-in',
    'link-data',
    'up',
    'dangling',
    'data',
    'new',
    '..',
    '.',
    '',
  ];
  const realOk = await realpath(ok);
  let allowed = 0;
  // Most start in the prefix, where a mistake would be subtle.
  const first = fc.oneof(
    { arbitrary: fc.constant('ok'), weight: 3 },
    { arbitrary: fc.constantFrom(...segments), weight: 1 },
  );
  await fc.assert(
    fc.asyncProperty(first, fc.array(fc.constantFrom(...segments), { maxLength: 6 }), async (head, parts) => {
      const hostPath = `${root}/${[head, ...parts].join('/')}`;
      if ((await verdict(hostPath)) !== 'allowed') return;
      allowed += 1;
      // What a provider does with it: create it, and work in whatever it resolves to.
      await mkdir(hostPath, { recursive: true });
      const landed = await realpath(hostPath);
      expect({ hostPath, under: isWithin(landed, realOk), inData: isWithin(landed, dataDir) }).toEqual({
        hostPath,
        under: true,
        inData: false,
      });
    }),
    { numRuns: 600 },
  );
  // The property looked at allowed paths too, not only refusals.
  expect(allowed).toBeGreaterThan(50);
});
