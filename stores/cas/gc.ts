import { z } from 'zod';
import { StasisError } from '../../common/errors';
// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore } from '../index';
import { checkPrefix } from '../keys';
import {
  decodeTopObject,
  invalid,
  isManifestUri,
  MAX_MANIFEST_JSON_BYTES,
  PACKS_DIR,
  PACK_SUFFIX,
  SEGMENTS_DIR,
  SEGMENT_SUFFIX,
  segmentsPrefixOf,
} from './manifest';

// Garbage collection of one sandbox's packs and manifest segments, mark and sweep:
// every manifest (top object) in the prefix is live and keeps the packs and segments
// it names; a pack or segment nothing names is deleted once it is older than the
// grace period. A release writes its packs and segments before its manifest, so a
// release in flight has only new objects younger than the grace (those it reuses
// are its baseline's, named by that live manifest); the provider runs its own collection under the sandbox's lifecycle lock,
// where no release of the sandbox can be in flight, with no grace. Any manifest
// that cannot be read stops the collection before anything is deleted.

/** Packs younger than this are never collected by default (a release in flight may name them soon). */
export const DEFAULT_GC_GRACE_MS = 60 * 60 * 1000;
/** The largest manifest read (compressed). */
const MAX_MANIFEST_BYTES = 512 * 1024 * 1024;

/** What marking reads of either format: pack uris, and (`stasis-cas-2`) segment names. */
const Named = z.object({
  packs: z.array(z.object({ uri: z.string() })),
  segments: z.array(z.tuple([z.string().regex(/^[0-9a-f]{64}$/)]).rest(z.unknown())).optional(),
});

export interface GcResult {
  manifests: number;
  packsKept: number;
  packsDeleted: number;
  segmentsKept: number;
  segmentsDeleted: number;
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
    if (!isManifestUri(object.key)) continue;
    options.signal?.throwIfAborted();
    let data: Buffer;
    try {
      data = await store.read(object.uri, MAX_MANIFEST_BYTES, options.signal);
    } catch (err) {
      if (err instanceof StasisError && err.code === 'NOT_FOUND') continue; // deleted meanwhile: not live
      throw err;
    }
    const json = await decodeTopObject(data, object.uri, MAX_MANIFEST_JSON_BYTES);
    const parsed = Named.safeParse(safeJson(json));
    if (!parsed.success) throw invalid(object.uri, 'is not a readable manifest: garbage collection stops here');
    for (const pack of parsed.data.packs) live.add(pack.uri);
    const segments = segmentsPrefixOf(object.uri);
    for (const [name] of parsed.data.segments ?? []) live.add(`${segments}${name}${SEGMENT_SUFFIX}`);
    manifests += 1;
  }
  const counts = { packsKept: 0, packsDeleted: 0, segmentsKept: 0, segmentsDeleted: 0 };
  for (const object of objects) {
    const pack = object.key.startsWith(`${prefix}${PACKS_DIR}`) && object.key.endsWith(PACK_SUFFIX);
    const segment = object.key.startsWith(`${prefix}${SEGMENTS_DIR}`) && object.key.endsWith(SEGMENT_SUFFIX);
    if (!pack && !segment) continue;
    if (live.has(object.uri) || object.modified.getTime() > cutoff) {
      counts[pack ? 'packsKept' : 'segmentsKept'] += 1;
      continue;
    }
    options.signal?.throwIfAborted();
    await store.delete(object.uri);
    counts[pack ? 'packsDeleted' : 'segmentsDeleted'] += 1;
  }
  return { manifests, ...counts };
}

function safeJson(data: Buffer): unknown {
  try {
    return JSON.parse(data.toString('utf8'));
  } catch {
    return undefined;
  }
}
