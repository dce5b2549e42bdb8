import { spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import { StasisError } from '../../common/errors';

// zstd through the `zstd` command (Debian's `zstd` package): Node 20's zlib has no
// zstd, and the command runs in its own process, off the worker's event loop and
// on another core, with no native module to build. One process per pack of a few
// MiB costs about a millisecond to start, small beside the pack.

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
    await run(['-d', '-q', '-f', '-o', output, input], Buffer.alloc(0), 0, 'decompress', blocks);
  } catch (err) {
    if (err instanceof StasisError && err.code === 'NOT_SUPPORTED') throw err;
    throw new StasisError('CHECKPOINT_INVALID', `${what} is not a valid zstd frame: ${(err as Error).message}`);
  }
  const out = await fs.readFile(output);
  if (out.length !== expectedBytes) {
    throw new StasisError(
      'CHECKPOINT_INVALID',
      `${what} decompresses to ${out.length} bytes, not the ${expectedBytes} its index records`,
    );
  }
  return out;
}

function run(args: string[], input: Buffer, maxBytes: number, what: string, maxFileBlocks?: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child =
      maxFileBlocks === undefined
        ? spawn('zstd', args, { env: ENV, stdio: ['pipe', 'pipe', 'pipe'] })
        : spawn('/bin/sh', ['-c', 'ulimit -f "$0" && exec zstd "$@"', String(maxFileBlocks), ...args], {
            env: ENV,
            stdio: ['pipe', 'pipe', 'pipe'],
          });
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
    const missing = () =>
      new StasisError('NOT_SUPPORTED', 'checkpoints need the zstd command on the worker’s host (apt-get install zstd)');
    child.on('error', (err: NodeJS.ErrnoException) => reject(err.code === 'ENOENT' ? missing() : err));
    child.on('close', (code, signal) => {
      if (overflow) reject(new Error(`zstd ${what}: output exceeds ${maxBytes} bytes`));
      // 127: the shell found no zstd to run.
      else if (maxFileBlocks !== undefined && code === 127) reject(missing());
      else if (signal === 'SIGXFSZ') reject(new Error(`zstd ${what}: output exceeds ${maxFileBlocks} blocks`));
      else if (code !== 0) reject(new Error(`zstd ${what} exited with ${code}: ${stderr.trim()}`));
      else resolve(Buffer.concat(out, bytes));
    });
    child.stdin.end(input);
  });
}
