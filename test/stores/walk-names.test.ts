import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { removeTree } from '../../providers/files';
import { s3StoreFromEnv, stasisError, tempDir, uniqueId } from '../providers/helpers';
import { describeTree, newSandboxRoot, restoreFresh, take } from './cas-helpers';

// Names are bytes on Linux; Node lists one that is not UTF-8 with U+FFFD in place of its bytes, a
// name that opens nothing, or another file that has that very spelling. A sandbox that makes one must
// not get a checkpoint that silently leaves a file out (it used to), nor a destroy or restore that can
// never remove its tree (every retry failed), nor the worker deleting another file than the listed one.
// Real files, real MinIO.

const store = s3StoreFromEnv(5 * 1024 * 1024);

/** `workspace/<bytes>` as a Buffer path under `root`. */
const rawPath = (root: string, name: Buffer) => Buffer.concat([Buffer.from(`${root}/workspace/`), name]);

it('a checkpoint of a tree with a name that is not UTF-8 is CHECKPOINT_INVALID naming it, never taken without it', async () => {
  const root = await newSandboxRoot();
  await fs.writeFile(path.join(root, 'workspace', 'ok.txt'), 'ok\n');
  await fs.writeFile(rawPath(root, Buffer.from([0x62, 0x61, 0x64, 0xff, 0x6e])), 'lost?\n');
  const sandboxId = uniqueId('names');
  const err = await stasisError(take(store, root, sandboxId), 'CHECKPOINT_INVALID');
  expect(err.message).toContain('workspace/bad\\\\xffn');
  expect(err.message).toContain('not UTF-8');
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});

it('a name spelled with U+FFFD itself (valid UTF-8) is checkpointed and restored', async () => {
  const root = await newSandboxRoot();
  await fs.writeFile(path.join(root, 'workspace', 'c\uFFFD'), 'replacement character\n');
  const sandboxId = uniqueId('names');
  const taken = await take(store, root, sandboxId);
  const { target } = await restoreFresh(store, taken.checkpoint);
  expect(await describeTree(target)).toEqual(await describeTree(root));
  await store.deletePrefix(`checkpoints/${sandboxId}/`);
});

it('a tree with names that are not UTF-8 (one spelled like a real file once decoded) is removed whole', async () => {
  const parent = await tempDir('names-remove');
  const root = path.join(parent, 'sandbox');
  await fs.mkdir(path.join(root, 'workspace'), { recursive: true });
  await fs.writeFile(path.join(root, 'workspace', 'c\uFFFD'), 'real\n');
  await fs.writeFile(rawPath(root, Buffer.from([0x63, 0xff])), 'not utf-8\n');
  await fs.mkdir(rawPath(root, Buffer.from([0x64, 0xfe])));
  await fs.writeFile(Buffer.concat([rawPath(root, Buffer.from([0x64, 0xfe])), Buffer.from('/inner')]), 'inner\n');
  await removeTree(root);
  expect(await fs.readdir(parent)).toEqual([]);
});
