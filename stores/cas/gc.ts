import { z } from 'zod';
import { StasisError } from '../../common/errors';
// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore } from '../index';
import { checkPrefix } from '../keys';
import { invalid, MANIFEST_SUFFIX, MAX_MANIFEST_JSON_BYTES, PACKS_DIR, PACK_SUFFIX } from './manifest';
import { zstdDecompress } from './zstd';

// Garbage collection of one sandbox's packs, mark and sweep: every manifest in
// the prefix is live and keeps the packs it names; a pack no manifest names is
// deleted once it is older than the grace period. A release writes its packs
// before its manifest, so a release in flight has only packs younger than the
// grace; the provider runs its own collection under the sandbox's lifecycle lock,
// where no release of the sandbox can be in flight, with no grace. Any manifest
// that cannot be read stops the collection before anything is deleted.

/** Packs younger than this are never collected by default (a release in flight may name them soon). */
export const DEFAULT_GC_GRACE_MS = 60 * 60 * 1000;
/** The largest manifest read (compressed). */
const MAX_MANIFEST_BYTES = 512 * 1024 * 1024;

const PackUris = z.object({ packs: z.array(z.object({ uri: z.string() })) });

export interface GcResult {
  manifests: number;
  packsKept: number;
  packsDeleted: number;
}

export async function collectGarbage(
  store: CheckpointStore,
  prefix: string,
  options: { graceMs?: number; now?: Date; signal?: AbortSignal } = {},
): Promise<GcResult> {
  checkPrefix(prefix);
  const cutoff = (options.now ?? new Date()).getTime() - (options.graceMs ?? DEFAULT_GC_GRACE_MS);
  const objects = await store.list(prefix);
  const live = new Set<string>();
  let manifests = 0;
  for (const object of objects) {
    if (!object.key.endsWith(MANIFEST_SUFFIX)) continue;
    options.signal?.throwIfAborted();
    let data: Buffer;
    try {
      data = await store.read(object.uri, MAX_MANIFEST_BYTES, options.signal);
    } catch (err) {
      if (err instanceof StasisError && err.code === 'NOT_FOUND') continue; // deleted meanwhile: not live
      throw err;
    }
    const json = await zstdDecompress(data, -1, `manifest ${object.uri}`, MAX_MANIFEST_JSON_BYTES);
    const parsed = PackUris.safeParse(safeJson(json));
    if (!parsed.success) throw invalid(object.uri, 'is not a readable manifest: garbage collection stops here');
    for (const pack of parsed.data.packs) live.add(pack.uri);
    manifests += 1;
  }
  let packsKept = 0;
  let packsDeleted = 0;
  for (const object of objects) {
    if (!object.key.startsWith(`${prefix}${PACKS_DIR}`) || !object.key.endsWith(PACK_SUFFIX)) continue;
    if (live.has(object.uri) || object.modified.getTime() > cutoff) {
      packsKept += 1;
      continue;
    }
    options.signal?.throwIfAborted();
    await store.delete(object.uri);
    packsDeleted += 1;
  }
  return { manifests, packsKept, packsDeleted };
}

function safeJson(data: Buffer): unknown {
  try {
    return JSON.parse(data.toString('utf8'));
  } catch {
    return undefined;
  }
}
