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

/**
 * FastCDC's inner loop (the gear scan) as WebAssembly: 2-3 times the speed of the JavaScript loop
 * above (32 MiB in 40-100 ms instead of 80-200 ms on the 2-core development machine under load),
 * which made cutting the largest cost of a first snapshot. 163 bytes, assembled by hand from:
 *
 *   (module
 *     (memory (export "memory") 1)            ;; the gear table at 0 (256 × i32), the data from 1024
 *     (func (export "cut") (param $p i32) (param $normal i32) (param $limit i32)
 *                          (param $maskSmall i32) (param $maskLarge i32) (result i32)
 *       (local $fp i32)
 *       (block (loop                           ;; up to the average size: the harder mask
 *         (br_if 1 (i32.ge_u (local.get $p) (local.get $normal)))
 *         (local.set $fp (i32.add (i32.shl (local.get $fp) (i32.const 1))
 *                                 (i32.load (i32.shl (i32.load8_u (local.get $p)) (i32.const 2)))))
 *         (local.set $p (i32.add (local.get $p) (i32.const 1)))
 *         (if (i32.eqz (i32.and (local.get $fp) (local.get $maskSmall))) (then (return (local.get $p))))
 *         (br 0)))
 *       (block (loop                           ;; then up to the largest: the easier one
 *         ... the same with $limit and $maskLarge ...))
 *       (local.get $limit)))
 *
 * `cut` returns the address just past the byte where the chunk ends (or $limit).
 */
export const GEAR_SCAN_WASM =
  'AGFzbQEAAAABCgFgBX9/f39/AX8DAgEABQMBAAEHEAIGbWVtb3J5AgADY3V0AAAKcgFwAQF/AkADQCAAIAFPDQEgBUEBdCAALQAAQQJ0KAIAaiEFIABBAWohACAFIANxRQRAIAAPCwwACwsCQANAIAAgAk8NASAFQQF0IAAtAABBAnQoAgBqIQUgAEEBaiEAIAUgBHFFBEAgAA8LDAALCyACCw==';

/** The WebAssembly global, as far as used here (the project's type libraries do not declare it). */
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { exports: Record<string, unknown> };
};

interface WasmMemory {
  buffer: ArrayBuffer;
  grow(pages: number): number;
}

/**
 * cutPoints with its gear scan in WebAssembly (GEAR_SCAN_WASM): the same cuts (a property test holds
 * them to cutPoints'), for the hashing thread. Each call copies `data` into the module's memory,
 * which grows to the largest piece and stays.
 *
 * Self-contained (no imports, no closures over this module): it runs in the hashing thread from its source text.
 */
export function wasmCutPoints(
  wasm: Uint8Array,
  gear: Int32Array,
): (data: Uint8Array, eof: boolean, min: number, avg: number, max: number) => number[] {
  const instance = new WebAssembly.Instance(new WebAssembly.Module(wasm));
  const memory = instance.exports.memory as WasmMemory;
  const scan = instance.exports.cut as (
    p: number,
    normal: number,
    limit: number,
    small: number,
    large: number,
  ) => number;
  const DATA = 1024;
  new Int32Array(memory.buffer, 0, 256).set(gear);
  return (data, eof, min, avg, max) => {
    let bits = 0;
    while (2 ** (bits + 1) <= avg) bits += 1;
    const maskSmall = ~0 << (32 - (bits + 2));
    const maskLarge = ~0 << (32 - (bits - 2));
    const need = DATA + data.length;
    if (memory.buffer.byteLength < need) memory.grow(Math.ceil((need - memory.buffer.byteLength) / 65536));
    new Uint8Array(memory.buffer, DATA, data.length).set(data);
    const ends: number[] = [];
    let start = 0;
    for (;;) {
      const left = data.length - start;
      if (left === 0 || (!eof && left < max)) return ends;
      let length = left;
      if (left > min) {
        const base = DATA + start;
        const limit = Math.min(left, max);
        length = scan(base + min, base + Math.min(avg, limit), base + limit, maskSmall, maskLarge) - base;
      }
      start += length;
      ends.push(start);
    }
  };
}
