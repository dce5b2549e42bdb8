import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';

// Workspaces of a given size: half in large incompressible files (build outputs,
// model weights, archives), half in many small text-like files (sources, which
// compress well), as a coding agent's workspace looks.

export const MiB = 1024 * 1024;

export interface WorkspaceShape {
  bytes: number;
  files: number;
}

const LARGE_FILE = 16 * MiB;
const SMALL_FILE = 16 * 1024;
const WORDS = [
  'const',
  'return',
  'function',
  'import',
  'export',
  'await',
  'value',
  'sandbox',
  'stasis',
  'result',
  '{',
  '}',
  '(',
  ')',
  ';',
  '\n',
];

function textChunk(bytes: number): Buffer {
  const seed = randomBytes(bytes);
  let text = '';
  for (let i = 0; text.length < bytes; i++) text += `${WORDS[seed[i % bytes] % WORDS.length]} `;
  return Buffer.from(text.slice(0, bytes));
}

/** Fills `dir` with `bytes` of mixed files; returns what was written. */
export async function fillWorkspace(dir: string, bytes: number): Promise<WorkspaceShape> {
  await fs.mkdir(dir, { recursive: true });
  let files = 0;
  let large = Math.floor(bytes / 2);
  for (let i = 0; large > 0; i++) {
    const size = Math.min(LARGE_FILE, large);
    await fs.writeFile(path.join(dir, `blob-${i}.bin`), randomBytes(size));
    large -= size;
    files += 1;
  }
  let small = bytes - Math.floor(bytes / 2);
  const template = textChunk(SMALL_FILE);
  for (let i = 0; small > 0; i++) {
    const size = Math.min(SMALL_FILE, small);
    const sub = path.join(dir, 'src', `m${Math.floor(i / 256)}`);
    if (i % 256 === 0) await fs.mkdir(sub, { recursive: true });
    // Each file differs (its index up front) so nothing deduplicates.
    const header = Buffer.from(`// file ${i}\n`);
    await fs.writeFile(
      path.join(sub, `f${i}.ts`),
      Buffer.concat([header, template.subarray(0, Math.max(0, size - header.length))]),
    );
    small -= size;
    files += 1;
  }
  return { bytes, files };
}

/** A shell command (for an exec step) that writes `bytes` of incompressible data into the workspace. */
export function fillCommand(bytes: number): string {
  return `head -c ${bytes} /dev/urandom > data.bin && mkdir -p src && for i in $(seq 1 32); do echo "export const v$i = $i;" > src/m$i.ts; done`;
}

/**
 * Fills `dir` with a `node_modules`-like tree of `files` small files (200 B to 8 KiB,
 * text-like, each different) in packages of 40 files under nested directories.
 */
export async function fillNodeModules(dir: string, files: number): Promise<WorkspaceShape> {
  const template = textChunk(8 * 1024);
  let bytes = 0;
  for (let i = 0; i < files; i++) {
    const sub = path.join(dir, 'node_modules', `pkg-${Math.floor(i / 40)}`, i % 40 < 20 ? 'lib' : 'dist');
    if (i % 20 === 0) await fs.mkdir(sub, { recursive: true });
    const header = Buffer.from(`// module ${i}\n`);
    const size = 200 + ((i * 7919) % (8 * 1024 - 200));
    const body = Buffer.concat([header, template.subarray(0, size - header.length)]);
    await fs.writeFile(path.join(sub, `m${i}.js`), body);
    bytes += body.length;
  }
  return { bytes, files };
}
