import { spawn, type ChildProcessByStdio } from 'node:child_process';
import type { Socket } from 'node:net';
import type { Readable, Writable } from 'node:stream';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { StasisError } from '../../common/errors';

// zstd through the `zstd` command (Debian's `zstd` package): Node 20's zlib has no
// zstd, and the command runs in its own process, off the worker's event loop and
// on another core, with no native module to build. Packs go file to file through
// one long-lived shell that starts a zstd per pack (runFile): spawning from the
// worker forks the whole worker (tens of milliseconds at hundreds of MiB, more at
// GiB, blocking its event loop), and a pipe carries the bytes 64 KiB per turn of
// the event loop. Small buffers (manifests) still go through a spawned zstd's pipes.

/** A fixed environment and search path: the worker's own environment never reaches the child. */
const ENV = { PATH: '/usr/local/bin:/usr/bin:/bin' };

let available: Promise<boolean> | undefined;

/**
 * Whether the `zstd` command runs on this host (asked once per process). A host
 * without it writes tar.gz checkpoints instead, so a fresh machine still works.
 */
export function zstdAvailable(command = 'zstd'): Promise<boolean> {
  const probe = () =>
    new Promise<boolean>((resolve) => {
      const child = spawn(command, ['--version'], { env: ENV, stdio: 'ignore' });
      child.on('error', () => resolve(false));
      child.on('exit', (code) => resolve(code === 0));
    });
  if (command !== 'zstd') return probe();
  available ??= probe();
  return available;
}

/** Compresses the file `input` into the file `output` at level 1 (see zstdCompress). */
export function zstdCompressFile(input: string, output: string): Promise<void> {
  return runFile('compress', input, output);
}

/** Compresses `data` at level 1 (suspend latency matters more than a few percent of size). */
export function zstdCompress(data: Buffer): Promise<Buffer> {
  return run(['-1', '-q', '-c'], data, Infinity, 'compress');
}

/**
 * Decompresses `data`, which must expand to exactly `expectedBytes` (-1: to at
 * most `maxBytes`), so a bomb or a truncated frame fails; a malformed frame is
 * CHECKPOINT_INVALID naming `what`.
 */
export async function zstdDecompress(
  data: Buffer,
  expectedBytes: number,
  what: string,
  maxBytes = expectedBytes,
): Promise<Buffer> {
  let out: Buffer;
  try {
    out = await run(['-d', '-q', '-c'], data, maxBytes, 'decompress');
  } catch (err) {
    if (err instanceof StasisError && err.code === 'NOT_SUPPORTED') throw err;
    throw new StasisError('CHECKPOINT_INVALID', `${what} is not a valid zstd frame: ${(err as Error).message}`);
  }
  if (expectedBytes >= 0 && out.length !== expectedBytes) {
    throw new StasisError(
      'CHECKPOINT_INVALID',
      `${what} decompresses to ${out.length} bytes, not the ${expectedBytes} its index records`,
    );
  }
  return out;
}

/**
 * Decompresses the file `input` into the file `output` (no pipe: through a pipe the
 * bytes cross the event loop 64 KiB at a time, several times slower under load),
 * then reads it; it must hold exactly `expectedBytes`. Only for a pack whose bytes
 * were verified against their recorded sha-256 first.
 */
export async function zstdDecompressFile(
  input: string,
  output: string,
  expectedBytes: number,
  what: string,
): Promise<Buffer> {
  // The file may grow one byte past what is expected (so the size check below tells), never further: a
  // bomb of a pack must not fill the disk. The shell's file size limit counts blocks of 512 bytes (or 1024).
  const blocks = Math.ceil((expectedBytes + 1) / 512);
  try {
    await runFile('decompress', input, output, blocks);
  } catch (err) {
    if (err instanceof StasisError && err.code === 'NOT_SUPPORTED') throw err;
    if (await noRoomFor(output, expectedBytes))
      throw Object.assign(new Error(`no space left to unpack ${what} (${expectedBytes} bytes)`, { cause: err }), {
        code: 'ENOSPC',
      });
    throw new StasisError('CHECKPOINT_INVALID', `${what} is not a valid zstd frame: ${(err as Error).message}`);
  }
  // Into shared memory: restore hashes its chunks in the hashing thread, which then sees them without a copy.
  const out = await readShared(output, expectedBytes);
  if (out.length !== expectedBytes) {
    throw new StasisError(
      'CHECKPOINT_INVALID',
      `${what} decompresses to ${out.length} bytes, not the ${expectedBytes} its index records`,
    );
  }
  return out;
}

/**
 * Whether a failed decompression into `output` ran out of disk: what it wrote and what is still free
 * together fall short of `bytes`. zstd's exit code for a write error differs between versions (its
 * message is not kept), and the pack's bytes were verified first, so the disk is the likelier cause;
 * a full disk is then the caller's ENOSPC (retried, or failed as no space), never a corrupt checkpoint.
 */
async function noRoomFor(output: string, bytes: number): Promise<boolean> {
  try {
    const [written, disk] = await Promise.all([
      fs.stat(output).then(
        (stat) => stat.blocks * 512,
        () => 0,
      ),
      fs.statfs(path.dirname(output)),
    ]);
    return written + disk.bavail * disk.bsize < bytes;
  } catch {
    return false;
  }
}

/** The file's bytes in shared memory; at most `limit` + 1 of them (enough to tell it is longer). */
async function readShared(file: string, limit: number): Promise<Buffer> {
  const handle = await fs.open(file, 'r');
  try {
    const buffer = Buffer.from(new SharedArrayBuffer(limit + 1));
    let done = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buffer, done, buffer.length - done, done);
      if (bytesRead === 0 || done + bytesRead === buffer.length) return buffer.subarray(0, done + bytesRead);
      done += bytesRead;
    }
  } finally {
    await handle.close();
  }
}

function run(args: string[], input: Buffer, maxBytes: number, what: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn('zstd', args, { env: ENV, stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let bytes = 0;
    let stderr = '';
    let overflow = false;
    child.stdout.on('data', (piece: Buffer) => {
      bytes += piece.length;
      if (bytes > maxBytes) {
        overflow = true;
        child.kill('SIGKILL');
        return;
      }
      out.push(piece);
    });
    child.stderr.on('data', (piece: Buffer) => {
      if (stderr.length < 2000) stderr += piece.toString();
    });
    child.stdin.on('error', () => undefined); // the exit code tells
    child.on('error', (err: NodeJS.ErrnoException) => reject(err.code === 'ENOENT' ? missingZstd() : err));
    child.on('close', (code) => {
      if (overflow) reject(new Error(`zstd ${what}: output exceeds ${maxBytes} bytes`));
      else if (code !== 0) reject(new Error(`zstd ${what} exited with ${code}: ${stderr.trim()}`));
      else resolve(Buffer.concat(out, bytes));
    });
    child.stdin.end(input);
  });
}

function missingZstd(): StasisError {
  return new StasisError(
    'NOT_SUPPORTED',
    'checkpoints need the zstd command on the worker’s host (apt-get install zstd)',
  );
}

/**
 * Compresses or decompresses the file `input` into the file `output` through
 * zstd jobs of one long-lived `/bin/sh` (see Helper): a worker holding gigabytes
 * pays for a fork of itself once, not per pack. `maxFileBlocks` bounds what the
 * output may grow to (the shell's file size limit, in blocks of 512 bytes or 1024).
 */
function runFile(
  mode: 'compress' | 'decompress',
  input: string,
  output: string,
  maxFileBlocks?: number,
): Promise<void> {
  if ([input, output].some((p) => p.includes('\n'))) throw new Error(`zstd ${mode}: a path with a newline`);
  return (helper ??= new Helper()).run(mode, input, output, maxFileBlocks);
}

/**
 * Reads jobs of five lines (id, block limit, mode, input, output) and runs each
 * zstd in a subshell of its own in the background (a fork of the small shell),
 * answering `<id> <exit code>` when it ends.
 *
 * A compression runs with --single-thread --no-asyncio where this zstd has them (1.5.3 on; asked
 * once): a pack is one job of its own, and zstd's I/O and compression threads, started and joined
 * for each, made a pack of 8 MiB cost ~4 times the CPU (10 packs of source text, 2 cores: 0.63 s
 * of CPU against 0.14 s); they can only help a stream that outlives them.
 */
const HELPER_SCRIPT = `
single=
zstd -q --single-thread --no-asyncio -c </dev/null >/dev/null 2>&1 && single='--single-thread --no-asyncio'
while IFS= read -r id && IFS= read -r blocks && IFS= read -r mode && IFS= read -r input && IFS= read -r output; do
  if [ "$mode" = -1 ]; then flags=$single; else flags=; fi
  ( ( ulimit -f "$blocks" && exec zstd $mode $flags -q -f -o "$output" -- "$input" ) </dev/null >/dev/null 2>&1; echo "$id $?" ) &
done
`;

/** 128 + SIGXFSZ: the file size limit stopped the job. */
const EXIT_FILE_TOO_LARGE = 153;
/** The shell found no zstd to run. */
const EXIT_NOT_FOUND = 127;

let helper: Helper | undefined;

class Helper {
  private readonly child: ChildProcessByStdio<Writable, Readable, null>;
  private readonly pending = new Map<number, (code: number | Error) => void>();
  private nextId = 0;
  private answers = '';

  constructor() {
    const child = spawn('/bin/sh', ['-c', HELPER_SCRIPT], { env: ENV, stdio: ['pipe', 'pipe', 'ignore'] });
    this.child = child;
    child.stdin.on('error', () => undefined); // the exit below tells
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (text: string) => {
      this.answers += text;
      let newline: number;
      while ((newline = this.answers.indexOf('\n')) >= 0) {
        const [id, code] = this.answers.slice(0, newline).split(' ').map(Number);
        this.answers = this.answers.slice(newline + 1);
        this.settle(id, code);
      }
    });
    const fail = (err: Error) => {
      if (helper === this) helper = undefined;
      for (const id of [...this.pending.keys()]) this.settle(id, err);
    };
    child.on('error', fail);
    child.on('exit', (code, signal) => fail(new Error(`zstd helper exited (${signal ?? code})`)));
    this.idle();
  }

  run(mode: 'compress' | 'decompress', input: string, output: string, maxFileBlocks?: number): Promise<void> {
    const id = (this.nextId += 1);
    return new Promise<void>((resolve, reject) => {
      this.pending.set(id, (code) => {
        if (code instanceof Error) reject(code);
        else if (code === 0) resolve();
        else if (code === EXIT_NOT_FOUND) reject(missingZstd());
        else if (code === EXIT_FILE_TOO_LARGE)
          reject(new Error(`zstd ${mode}: output exceeds ${maxFileBlocks} blocks`));
        else reject(new Error(`zstd ${mode} exited with ${code}`));
      });
      // Kept alive only while it has work: an idle helper never holds the process open.
      if (this.pending.size === 1) this.busy();
      const args = mode === 'compress' ? '-1' : '-d';
      this.child.stdin.write(`${id}\n${maxFileBlocks ?? 'unlimited'}\n${args}\n${input}\n${output}\n`);
    });
  }

  private settle(id: number, code: number | Error): void {
    const done = this.pending.get(id);
    if (!done) return;
    this.pending.delete(id);
    if (this.pending.size === 0) this.idle();
    done(code);
  }

  private busy(): void {
    this.child.ref();
    for (const pipe of [this.child.stdout, this.child.stdin]) (pipe as unknown as Socket).ref();
  }

  private idle(): void {
    this.child.unref();
    for (const pipe of [this.child.stdout, this.child.stdin]) (pipe as unknown as Socket).unref();
  }
}

/** zstd's frame magic number, little-endian. */
const FRAME_MAGIC = 0xfd2fb528;
/** The largest block a frame may hold (RFC 8878: Block_Maximum_Size). */
const MAX_BLOCK_BYTES = 128 * 1024;

/**
 * `parts` (`size` bytes in all) as one zstd frame of raw (stored) blocks, as `zstd -d` reads any
 * frame: what `zstd -1` writes itself for bytes it cannot shrink, without a process, a temp file or
 * a pass over the bytes (a list of views: the parts are not copied). No content checksum: a pack is
 * checked against its sha-256 and each chunk against its own.
 */
export function zstdRawFrame(parts: readonly Buffer[], size: number): Buffer[] {
  // Frame_Header_Descriptor 0xa0: Frame_Content_Size in 4 bytes, single segment (no window
  // descriptor), no checksum, no dictionary. Packs are far below 4 GiB.
  if (!Number.isInteger(size) || size < 0 || size > 0xffffffff) throw new Error(`raw zstd frame of ${size} bytes`);
  const header = Buffer.alloc(9);
  header.writeUInt32LE(FRAME_MAGIC, 0);
  header[4] = 0xa0;
  header.writeUInt32LE(size, 5);
  const out: Buffer[] = [header];
  const blocks: Buffer[] = [];
  let total = 0;
  for (const part of parts) {
    for (let at = 0; at < part.length; at += MAX_BLOCK_BYTES) blocks.push(part.subarray(at, at + MAX_BLOCK_BYTES));
    total += part.length;
  }
  if (total !== size) throw new Error(`raw zstd frame: parts hold ${total} bytes, not ${size}`);
  if (blocks.length === 0) blocks.push(Buffer.alloc(0));
  blocks.forEach((block, i) => {
    // Block_Header: Last_Block (bit 0), Block_Type 0 = Raw (bits 1-2), Block_Size (bits 3-23), little-endian.
    const word = (block.length << 3) | (i === blocks.length - 1 ? 1 : 0);
    out.push(Buffer.from([word & 0xff, (word >> 8) & 0xff, (word >> 16) & 0xff]), block);
  });
  return out;
}

/** Bytes a sample window holds, and how many windows of a chunk are looked at. */
const SAMPLE_BYTES = 4096;
const SAMPLES = 4;
/** Smaller chunks always go to zstd: sampling them would cost about what compressing them does. */
export const INCOMPRESSIBLE_MIN_BYTES = 64 * 1024;
/**
 * Bits per byte (order-0 entropy) above which a window counts as incompressible: uniformly random
 * bytes measure ~7.95 in 4 KiB; compressed or encrypted data likewise; text ~4.5, machine code ~6.
 */
const INCOMPRESSIBLE_BITS = 7.8;
/** c·log2(c) for each count a window can hold. */
const C_LOG_C = Float64Array.from({ length: SAMPLE_BYTES + 1 }, (_, c) => (c === 0 ? 0 : c * Math.log2(c)));

/**
 * Whether `bytes` look incompressible to zstd -1 (random, already compressed or encrypted), judged
 * from the byte entropy of SAMPLES windows spread over it. A wrong guess costs size, never bytes:
 * a chunk stored raw restores the same. Repeats within a chunk of otherwise random bytes are missed.
 */
export function looksIncompressible(bytes: Uint8Array): boolean {
  if (bytes.length < INCOMPRESSIBLE_MIN_BYTES) return false;
  const counts = new Uint32Array(256);
  const step = Math.floor((bytes.length - SAMPLE_BYTES) / (SAMPLES - 1));
  for (let s = 0; s < SAMPLES; s += 1) {
    counts.fill(0);
    const from = s * step;
    for (let i = from; i < from + SAMPLE_BYTES; i += 1) counts[bytes[i]] += 1;
    // The entropy of the window in bits: n·log2(n) − Σ c·log2(c) over the byte values' counts c.
    let sum = 0;
    for (let v = 0; v < 256; v += 1) sum += C_LOG_C[counts[v]];
    if ((C_LOG_C[SAMPLE_BYTES] - sum) / SAMPLE_BYTES < INCOMPRESSIBLE_BITS) return false;
  }
  return true;
}

/**
 * The bytes of the pack file `file` if it is exactly one frame of raw blocks as zstdRawFrame writes
 * them (its header, holding `size` bytes, raw blocks only, nothing after the last), in shared memory
 * (see zstdDecompressFile); otherwise undefined, and zstd judges it (zstdDecompressFile). A pack of
 * incompressible chunks then needs no zstd process, second temporary file or read back: the file is
 * read once, and its blocks moved together in place. Only for a pack verified against its recorded
 * sha-256; every chunk is checked against its own hash before it is used.
 */
export async function zstdRawFrameFile(file: string, size: number): Promise<Buffer | undefined> {
  const handle = await fs.open(file, 'r');
  let frame: Buffer;
  try {
    const { size: length } = await handle.stat();
    // At least one block header per MAX_BLOCK_BYTES, and at most one per byte (or one, empty): anything else is zstd's.
    const most = 9 + size + 3 * Math.max(1, size);
    if (!Number.isInteger(size) || size < 0 || size > 0xffffffff || length < 12 + size || length > most) {
      return undefined;
    }
    // A frame zstd compressed (most packs of text) tells by its first bytes: not read whole for nothing.
    const head = Buffer.alloc(12);
    if ((await handle.read(head, 0, 12, 0)).bytesRead !== 12 || !rawFrameHead(head, size)) return undefined;
    frame = Buffer.from(new SharedArrayBuffer(length));
    for (let done = 0; done < length;) {
      const { bytesRead } = await handle.read(frame, done, length - done, done);
      if (bytesRead === 0) return undefined; // shorter than it was a moment ago
      done += bytesRead;
    }
  } finally {
    await handle.close();
  }
  if (!rawFrameHead(frame, size)) return undefined;
  let at = 9;
  let filled = 0;
  for (;;) {
    if (at + 3 > frame.length) return undefined;
    const word = frame[at] | (frame[at + 1] << 8) | (frame[at + 2] << 16);
    const length = word >>> 3;
    // Not raw (RLE, compressed, reserved), larger than a block may be, or past the frame or its size: zstd's to judge.
    if (((word >>> 1) & 3) !== 0 || length > MAX_BLOCK_BYTES) return undefined;
    at += 3;
    if (at + length > frame.length || filled + length > size) return undefined;
    // Leftwards over the headers already read (a memmove): the next header, past this block, stays as it is.
    frame.copyWithin(filled, at, at + length);
    at += length;
    filled += length;
    if (word & 1) break;
  }
  return at === frame.length && filled === size ? frame.subarray(0, size) : undefined;
}

/** Whether `frame` starts as zstdRawFrame's frames do for `size` bytes: that header, then a raw block. */
function rawFrameHead(frame: Buffer, size: number): boolean {
  return (
    frame.readUInt32LE(0) === FRAME_MAGIC && frame[4] === 0xa0 && frame.readUInt32LE(5) === size && (frame[9] & 6) === 0
  );
}
