import { gzipSync } from 'node:zlib';

// Tar archives written byte by byte in the ustar/pax wire format, without any
// tar library, so a test can say anything a hostile archive could: absolute
// paths, `..`, devices, links anywhere, odd modes, any type flag.

export interface WireEntry {
  path: string;
  /** The ustar type flag: '0' file, '1' hardlink, '2' symlink, '3' char device, '4' block device, '5' dir, '6' FIFO, '7' contiguous file, or anything else. */
  type: string;
  mode?: number;
  linkpath?: string;
  data?: Buffer;
  mtime?: number;
}

const BLOCK = 512;

/** The archive as a tar (gzipped unless `gzip: false`); paths and link targets longer than ustar's 100 bytes go in a pax header. */
export function wireArchive(entries: WireEntry[], options: { gzip?: boolean } = {}): Buffer {
  const blocks: Buffer[] = [];
  for (const entry of entries) {
    const data = entry.data ?? Buffer.alloc(0);
    const pax: Record<string, string> = {};
    if (Buffer.byteLength(entry.path) > 100) pax.path = entry.path;
    if (entry.linkpath !== undefined && Buffer.byteLength(entry.linkpath) > 100) pax.linkpath = entry.linkpath;
    if (Object.keys(pax).length > 0) {
      const body = Buffer.from(
        Object.entries(pax)
          .map(([key, value]) => paxRecord(key, value))
          .join(''),
      );
      blocks.push(header({ path: 'PaxHeader', type: 'x', size: body.length }), padded(body));
    }
    blocks.push(
      header({
        path: entry.path,
        type: entry.type,
        size: data.length,
        mode: entry.mode ?? (entry.type === '5' ? 0o755 : 0o644),
        linkpath: entry.linkpath ?? '',
        mtime: entry.mtime ?? 1_700_000_000,
      }),
      padded(data),
    );
  }
  blocks.push(Buffer.alloc(2 * BLOCK));
  const tar = Buffer.concat(blocks);
  return options.gzip === false ? tar : gzipSync(tar);
}

function header(fields: {
  path: string;
  type: string;
  size: number;
  mode?: number;
  linkpath?: string;
  mtime?: number;
}): Buffer {
  const block = Buffer.alloc(BLOCK);
  block.write(truncate(fields.path, 100), 0, 'utf8');
  octal(block, 100, 8, fields.mode ?? 0o644);
  octal(block, 108, 8, 0);
  octal(block, 116, 8, 0);
  octal(block, 124, 12, fields.size);
  octal(block, 136, 12, fields.mtime ?? 0);
  block.fill(' ', 148, 156);
  block.write(fields.type.slice(0, 1), 156, 'latin1');
  block.write(truncate(fields.linkpath ?? '', 100), 157, 'utf8');
  block.write('ustar\u000000', 257, 'latin1');
  octal(block, 329, 8, 0);
  octal(block, 337, 8, 0);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.write(`${sum.toString(8).padStart(6, '0')}\u0000 `, 148, 'latin1');
  return block;
}

/** The first `max` bytes of `text` (the pax header carries the whole of it). */
function truncate(text: string, max: number): string {
  const bytes = Buffer.from(text);
  return bytes.length <= max ? text : bytes.subarray(0, max).toString('latin1');
}

function octal(block: Buffer, offset: number, length: number, value: number): void {
  block.write(`${value.toString(8).padStart(length - 1, '0')}\u0000`, offset, 'latin1');
}

function padded(data: Buffer): Buffer {
  const rest = data.length % BLOCK;
  return rest === 0 ? data : Buffer.concat([data, Buffer.alloc(BLOCK - rest)]);
}

/** "<length> <key>=<value>\n", where the length counts itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length) length += 1;
  return `${length}${body}`;
}
