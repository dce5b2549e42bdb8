// FastCDC (Xia et al., USENIX ATC 2016): content-defined chunking with a gear
// rolling hash and normalised chunk sizes. A cut depends only on the bytes from
// the chunk's start to at most `max` bytes on, so an insertion moves the cuts
// near it and none further on, and the cuts do not depend on how the bytes
// arrive (see cutPoints).

export interface ChunkSizes {
  min: number;
  avg: number;
  max: number;
}

/** 256 KiB to 4 MiB, 1 MiB on average (restic and borg use the same scale). */
export const CHUNK_SIZES: ChunkSizes = { min: 256 * 1024, avg: 1024 * 1024, max: 4 * 1024 * 1024 };

/** The gear table: 256 pseudo-random 32-bit words from a fixed seed (mulberry32), the same everywhere. */
export function gearTable(): Int32Array {
  const table = new Int32Array(256);
  let seed = 0x5eed_cdc0;
  for (let i = 0; i < 256; i += 1) {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), seed | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    table[i] = t ^ (t >>> 14);
  }
  return table;
}

/**
 * The ends (offsets past the last byte) of the chunks that can be cut from
 * `data` now. Without `eof`, a chunk is only cut where at least `max` bytes are
 * available, so the bytes after the last end are carried into the next call and
 * the cuts are the same however the stream is split. With `eof`, `data` is cut
 * to its end.
 *
 * Self-contained (no imports, no closures): it also runs in the hashing worker
 * thread from its source text.
 */
export function cutPoints(
  data: Uint8Array,
  eof: boolean,
  min: number,
  avg: number,
  max: number,
  gear: Int32Array,
): number[] {
  let bits = 0;
  while (2 ** (bits + 1) <= avg) bits += 1;
  // Harder to match below the average size, easier above it (normalised chunking); the
  // masks take the top bits, which depend on the last 32 bytes.
  const maskSmall = ~0 << (32 - (bits + 2));
  const maskLarge = ~0 << (32 - (bits - 2));
  const ends: number[] = [];
  let start = 0;
  for (;;) {
    const left = data.length - start;
    if (left === 0 || (!eof && left < max)) return ends;
    let length = left;
    if (left > min) {
      const limit = Math.min(left, max);
      const normal = Math.min(avg, limit);
      let fp = 0;
      let i = min;
      length = limit;
      for (; i < normal; i += 1) {
        fp = ((fp << 1) + gear[data[start + i]]) | 0;
        if ((fp & maskSmall) === 0) break;
      }
      if (i < normal) length = i + 1;
      else {
        for (; i < limit; i += 1) {
          fp = ((fp << 1) + gear[data[start + i]]) | 0;
          if ((fp & maskLarge) === 0) break;
        }
        if (i < limit) length = i + 1;
      }
    }
    start += length;
    ends.push(start);
  }
}
