import fc from 'fast-check';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { RACY_MARGIN_NS } from '../../stores/cas/baseline';
import type { Manifest } from '../../stores/cas/manifest';
import { s3StoreFromEnv, uniqueId } from '../providers/helpers';
import { bytes, describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// A file the baseline vouches for keeps the baseline's own entry, and a take whose files all kept
// theirs keeps the baseline's chunk locations and packs. Whatever changed besides the files (or
// removed one), the manifest must be the one a take without a baseline describes, locate exactly
// the chunks its files name, and restore from the store alone to the tree.

const store = s3StoreFromEnv(5 * 1024 * 1024);
const racyMarginMs = Number(RACY_MARGIN_NS / 1_000_000n) + 10;

/** The entries as a manifest holds them (JSON), without what only differs by upload (nothing, for entries). */
const entriesOf = (manifest: Manifest) => JSON.parse(JSON.stringify(manifest.entries)) as unknown;

/** The chunk hashes the manifest's files name. */
const named = (manifest: Manifest) => new Set(manifest.entries.flatMap((entry) => entry.c ?? []));

test('vouched files: entries as a full take makes them, exactly the named chunks located, restored byte for byte', async () => {
  const edit = fc.record({
    kind: fc.constantFrom('none', 'relink', 'chmod-dir', 'mkdir', 'remove', 'hardlink', 'write', 'rename'),
    at: fc.nat(),
  });
  await fc.assert(
    fc.asyncProperty(fc.array(edit, { maxLength: 4 }), async (edits) => {
      const root = await newSandboxRoot();
      const files: string[] = [];
      for (let d = 0; d < 3; d += 1) {
        await fs.mkdir(path.join(root, 'workspace', `p${d}`));
        for (let i = 0; i < 20; i += 1) {
          files.push(path.join('workspace', `p${d}`, `f${i}.js`));
          await fs.writeFile(path.join(root, files.at(-1)!), bytes(i === 0 ? 0 : 100 + i * 37));
        }
        await fs.symlink(`f${d}.js`, path.join(root, 'workspace', `p${d}`, 'link'));
      }
      await fs.writeFile(path.join(root, 'home', 'large.bin'), bytes(1_500_000));
      const sandboxId = uniqueId('cas-vouch');
      await delay(racyMarginMs);
      const first = await take(store, root, sandboxId);
      await delay(racyMarginMs);
      let filesTouched = false;
      for (const [n, e] of edits.entries()) {
        const file = path.join(root, files[e.at % files.length]);
        const dir = path.dirname(file);
        const exists = await fs.lstat(file).then(
          () => true,
          () => false,
        );
        if (e.kind === 'relink') {
          await fs.rm(path.join(dir, 'link'), { force: true });
          await fs.symlink(`elsewhere-${n}`, path.join(dir, 'link'));
        }
        if (e.kind === 'chmod-dir') await fs.chmod(dir, 0o700 + (n % 2) * 0o50);
        if (e.kind === 'mkdir') await fs.mkdir(path.join(dir, `empty${n}`), { recursive: true });
        if (!exists) continue;
        if (e.kind === 'remove') await fs.rm(file);
        if (e.kind === 'hardlink') await fs.link(file, `${file}.hard${n}`);
        if (e.kind === 'write') await fs.writeFile(file, bytes(50 + n));
        if (e.kind === 'rename') await fs.rename(file, `${file}.moved${n}`);
        filesTouched ||= ['remove', 'hardlink', 'write', 'rename'].includes(e.kind);
      }
      await delay(racyMarginMs);
      const again = await take(store, root, sandboxId, first.baseline);
      const fullId = uniqueId('cas-vouch-full');
      const full = await take(store, root, fullId);
      expect(entriesOf(again.baseline.manifest)).toEqual(entriesOf(full.baseline.manifest));
      expect(new Set(Object.keys(again.baseline.manifest.chunks))).toEqual(named(again.baseline.manifest));
      if (!filesTouched) {
        // Nothing a file is made of changed: not a byte read, the baseline's chunks and packs as they were.
        expect(again.stats).toMatchObject({ filesHashed: 0, packs: 0 });
        expect(again.baseline.manifest.packs).toEqual(first.baseline.manifest.packs);
      }
      expect(await describeTree((await restoreFresh(store, again.checkpoint)).target)).toEqual(
        await describeTree(root),
      );
      await store.deletePrefix(`checkpoints/${sandboxId}/`);
      await store.deletePrefix(`checkpoints/${fullId}/`);
    }),
    { numRuns: 10 },
  );
});
