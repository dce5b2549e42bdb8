import { createHash } from 'node:crypto';
import { Worker } from 'node:worker_threads';
import { CHUNK_SIZES, GEAR_SCAN_WASM, gearTable, wasmCutPoints, type ChunkSizes } from './fastcdc';

// Chunking and sha-256 of chunk data run in one worker thread, so a checkpoint of
// gigabytes never holds the worker's event loop (activities, heartbeats) for more
// than a copy. Pieces below INLINE_HASH_BYTES are hashed in place: a message costs more.

export const INLINE_HASH_BYTES = 64 * 1024;

/** The chunks of a piece: their ends (offsets past their last byte) and sha-256 hashes (hex). */
export interface Chunked {
  ends: number[];
  hashes: string[];
}

/** sha-256 (hex) of `data`: the chunk hash of the content-addressed checkpoints. */
export function chunkHash(data: Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Cuts `data` with FastCDC (see cutPoints for `eof`) and hashes each chunk. */
export function cutAndHash(data: Buffer, eof: boolean, sizes: ChunkSizes = CHUNK_SIZES): Promise<Chunked> {
  return request({ data, cut: { eof, ...sizes } });
}

/** Hashes the byte ranges `[start, end)` of `data` (in the hashing thread, unless `data` is small). */
export function hashSpans(data: Buffer, spans: [number, number][]): Promise<string[]> {
  if (data.length < INLINE_HASH_BYTES) return Promise.resolve(spans.map(([a, b]) => chunkHash(data.subarray(a, b))));
  return request({ data, spans }).then((reply) => reply.hashes);
}

/** Hashes the pieces of `data` that `ends` delimit. */
export function hashRanges(data: Buffer, ends: number[]): Promise<Chunked> {
  if (data.length < INLINE_HASH_BYTES) {
    let start = 0;
    return Promise.resolve({ ends, hashes: ends.map((end) => chunkHash(data.subarray(start, (start = end)))) });
  }
  return request({ data, ends });
}

interface Request {
  data: Buffer;
  ends?: number[];
  spans?: [number, number][];
  cut?: ChunkSizes & { eof: boolean };
}

const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const cutPoints = (${wasmCutPoints.toString()})(workerData.wasm, workerData.gear);
parentPort.on('message', ({ id, data, ends, spans, cut }) => {
  try {
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (spans) {
      const hashes = spans.map(([a, b]) => createHash('sha256').update(bytes.subarray(a, b)).digest('hex'));
      parentPort.postMessage({ id, ends: [], hashes });
      return;
    }
    const cuts = cut ? cutPoints(bytes, cut.eof, cut.min, cut.avg, cut.max) : ends;
    const hashes = [];
    let start = 0;
    for (const end of cuts) {
      hashes.push(createHash('sha256').update(bytes.subarray(start, end)).digest('hex'));
      start = end;
    }
    parentPort.postMessage({ id, ends: cuts, hashes });
  } catch (err) {
    parentPort.postMessage({ id, error: String(err && err.stack ? err.stack : err) });
  }
});
`;

let worker: Worker | undefined;
let nextId = 0;
const pending = new Map<number, { resolve: (value: Chunked) => void; reject: (err: Error) => void }>();

function request(message: Request): Promise<Chunked> {
  const id = (nextId += 1);
  const running = worker ?? startWorker();
  return new Promise<Chunked>((resolve, reject) => {
    pending.set(id, { resolve, reject });
    // Kept alive only while it has work: an idle hasher never holds the process open.
    if (pending.size === 1) running.ref();
    // A view posts its whole underlying buffer (structured clone copies all of it): only the view's bytes go.
    // Shared memory is shared, not copied, whatever the view.
    const { data } = message;
    const whole = data.byteOffset === 0 && data.byteLength === data.buffer.byteLength;
    const own = whole || data.buffer instanceof SharedArrayBuffer ? data : Buffer.from(data);
    running.postMessage({ id, ...message, data: own });
  });
}

function startWorker(): Worker {
  const started = new Worker(WORKER_SOURCE, {
    eval: true,
    workerData: { gear: gearTable(), wasm: Buffer.from(GEAR_SCAN_WASM, 'base64') },
  });
  started.unref();
  started.on('message', (reply: { id: number; ends?: number[]; hashes?: string[]; error?: string }) => {
    const waiter = pending.get(reply.id);
    if (!waiter) return;
    pending.delete(reply.id);
    if (pending.size === 0) started.unref();
    if (reply.error !== undefined || !reply.ends || !reply.hashes)
      waiter.reject(new Error(`hashing worker: ${reply.error}`));
    else waiter.resolve({ ends: reply.ends, hashes: reply.hashes });
  });
  const fail = (err: Error) => {
    if (worker === started) worker = undefined;
    for (const waiter of pending.values()) waiter.reject(err);
    pending.clear();
  };
  started.on('error', fail);
  started.on('exit', (code) => fail(new Error(`hashing worker exited with code ${code}`)));
  worker = started;
  return started;
}
