// Through the index: a path ending in /api reads as the REST layer to the import rules.
import type { CheckpointStore } from '../index';
import { Lanes } from './lanes';
import {
  compressSegment,
  SEGMENT_SUFFIX,
  SEGMENTS_DIR,
  Segmenter,
  type ChunkPlace,
  type Manifest,
  type ManifestEntry,
  type SegmentBody,
  type SegmentRef,
} from './manifest';

/** Segments uploading at once: small objects, so the store's latency, not its bandwidth, sets the pace. */
const SEGMENT_UPLOADS = 16;

/**
 * Stores a checkpoint's manifest segments (`stasis-cas-2`) while its walk goes on: entries are given
 * in order as soon as each is complete (its chunks located), and each segment they end that the
 * baseline's checkpoint does not already name is compressed and uploaded under its name (a retry or
 * another checkpoint with the same segment writes the same bytes). Made and stored only once the walk
 * was over, the ~80 segments of a first snapshot of 20,000 files took as long as the walk itself.
 * The baseline's segments are reused only as its packs are: while its checkpoint exists
 * (usableBaseline), which keeps them from garbage collection.
 */
export class SegmentUploads {
  private readonly segmenter: Segmenter;
  /** The baseline's segments, by name. */
  private readonly stored: Map<string, SegmentRef>;
  private readonly uploads = new Map<string, Promise<SegmentRef>>();
  /** Every segment so far, in order: the baseline's ref, or its upload. */
  private readonly refs: (SegmentRef | Promise<SegmentRef>)[] = [];
  private readonly lanes = new Lanes(SEGMENT_UPLOADS);
  private failure: unknown;
  /** Segments uploaded, and their stored bytes. */
  uploaded = 0;
  uploadedBytes = 0;

  constructor(
    private readonly input: {
      store: CheckpointStore;
      /** `checkpoints/<sandboxId>/` */
      prefix: string;
      progress: { bytes: number };
      signal?: AbortSignal;
    },
    locate: (hash: string) => ChunkPlace | undefined,
    baseline: { manifest: Manifest; split?: boolean } | undefined,
  ) {
    // Its entries are those of its segments only if this engine split and stored it (Baseline.split);
    // its segments are in the store either way (a restore's baseline read them).
    this.segmenter = new Segmenter(locate, baseline?.split ? baseline.manifest : undefined);
    this.stored = new Map((baseline?.manifest.segments ?? []).map((ref) => [ref[0], ref]));
  }

  /** Takes the next entry of the manifest, its chunks located; throws once an upload has failed. */
  add(entry: ManifestEntry): void {
    if (this.failure !== undefined) throw this.failure;
    const segment = this.segmenter.push(entry);
    if (segment) this.store(segment);
  }

  /** Once every entry was given: the refs of all segments, in order, once each is stored. */
  async finish(): Promise<SegmentRef[]> {
    const last = this.segmenter.end();
    if (last) this.store(last);
    const refs: SegmentRef[] = [];
    for (const ref of this.refs) refs.push(await ref);
    return refs;
  }

  /**
   * Fails the checkpoint's segments with `err` (a pack's upload failed): none waiting for its turn
   * starts, and finish and add throw. Those already being put end as they will.
   */
  stop(err: unknown): void {
    this.failure ??= err;
  }

  /** Starts no more, and waits for the uploads under way, so nothing is still writing once the attempt has failed. */
  async abandon(): Promise<void> {
    this.failure ??= new Error('the checkpoint was abandoned');
    await Promise.allSettled(this.uploads.values());
  }

  private store({ ref, json }: SegmentBody): void {
    const name = ref[0];
    const stored = this.stored.get(name);
    if (stored) {
      this.refs.push(stored);
      return;
    }
    let upload = this.uploads.get(name);
    if (!upload) {
      if (json === undefined) throw new Error(`segment ${name} is neither new nor the baseline's`);
      const { store, prefix, progress, signal } = this.input;
      upload = this.lanes.run(async (): Promise<SegmentRef> => {
        if (this.failure !== undefined) throw this.failure;
        signal?.throwIfAborted();
        const body = await compressSegment(json);
        if (this.failure !== undefined) throw this.failure;
        await store.putBytes(`${prefix}${SEGMENTS_DIR}${name}${SEGMENT_SUFFIX}`, body, {}, signal);
        this.uploaded += 1;
        this.uploadedBytes += body.length;
        progress.bytes += body.length;
        return [name, body.length, ref[2], ref[3]];
      });
      upload.catch((err: unknown) => {
        this.failure ??= err;
      });
      this.uploads.set(name, upload);
    }
    this.refs.push(upload);
  }
}
