import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { DEFAULT_ARCHIVE_LIMITS, type ArchiveLimits } from '../../stores/archive';
import { MANIFEST_SUFFIX } from '../../stores/cas/manifest';
import { takeCheckpoint } from '../../stores/cas/upload';
import { StasisError } from '../../common/errors';
import { s3StoreFromEnv, uniqueId } from '../providers/helpers';
import { newSandboxRoot, restoreFresh } from './cas-helpers';

// A checkpoint a release stores must be one a restore reads (the release terminates compute once it is
// stored). A restore reads at most limits.maxEntries × 8192 bytes of manifest JSON; a byte of a name or
// link target that is not UTF-8 takes six in JSON (`\udcff`), so a sandbox's long such targets made a
// manifest the release stored and every restore refused (found by the attack review of raw names). The
// release now checks the same budget and refuses first, storing no top object: compute stays up.

const store = s3StoreFromEnv(5 * 1024 * 1024);
const SMALL: ArchiveLimits = { ...DEFAULT_ARCHIVE_LIMITS, maxEntries: 60 };

async function take(root: string, prefix: string) {
  return takeCheckpoint({
    store,
    rootDir: root,
    names: ['workspace', 'home', 'envs'],
    prefix,
    name: uniqueId('t'),
    labels: {},
    limits: SMALL,
    progress: { bytes: 0 },
  });
}

it('40 symlinks with 4,000-byte ASCII targets: taken and restored under maxEntries 60 (within the budget)', async () => {
  const root = await newSandboxRoot();
  for (let i = 0; i < 40; i += 1) await fs.symlink('a'.repeat(4000), path.join(root, 'workspace', `l${i}`));
  const prefix = `checkpoints/${uniqueId('budget')}/`;
  try {
    const { checkpoint } = await take(root, prefix);
    const { target } = await restoreFresh(store, checkpoint, undefined, SMALL);
    expect(await fs.readlink(path.join(target, 'workspace', 'l39'))).toBe('a'.repeat(4000));
  } finally {
    await store.deletePrefix(prefix);
  }
}, 60_000);

it.each([
  ['not UTF-8 (6 bytes of JSON each)', Buffer.alloc(4000, 0xff)],
  ['of U+0001 (valid UTF-8, escaped by JSON too)', Buffer.alloc(4000, 0x01)],
])(
  '40 symlinks with 4,000-byte targets %s: the release is refused (CHECKPOINT_INVALID naming the budget) and stores no manifest',
  async (_what, bytes) => {
    const root = await newSandboxRoot();
    for (let i = 0; i < 40; i += 1) await fs.symlink(bytes, Buffer.from(path.join(root, 'workspace', `l${i}`)));
    const prefix = `checkpoints/${uniqueId('budget')}/`;
    try {
      const err = await take(root, prefix).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(StasisError);
      expect(err).toMatchObject({
        code: 'CHECKPOINT_INVALID',
        message: expect.stringMatching(/manifest would be \d+ bytes of JSON, above the 491520 a restore reads/),
      });
      // No top object: nothing names a checkpoint a restore would refuse.
      const stored = await store.list(prefix);
      expect(stored.filter((o) => o.uri.endsWith(MANIFEST_SUFFIX))).toEqual([]);
    } finally {
      await store.deletePrefix(prefix);
    }
  },
  60_000,
);
