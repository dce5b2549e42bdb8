import { spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Parser, type ReadEntry } from 'tar';
import { CHECKPOINT_DIRS, packSandbox } from '../../stores/archive';
import { swapLoop, swapping, tempDir } from '../providers/helpers';
import { Tally, writeSummary } from './helpers';

// Area pack-race: a process of the sandbox that escaped its freeze swaps (renameat2
// exchange) a workspace directory with a link to a host directory, as fast as it can,
// while the checkpoint packer walks the workspace, hundreds of times. Not one byte of
// a host file, nor the name of one, may end up in an archive.

const tally = new Tally();
const figures = { escapes: 0, archives: 0, packErrors: 0 };
const TRIALS = 300;
// Of one length, so a header from one file and bytes from the other still show as a leak.
const INSIDE = 'inside-content-of-the-sandbox';
const HOST_SECRET = 'HOST-SECRET-CONTENT-OF-A-HOST';
const FILES = 20;

/** Every entry of a packed archive, by path, with its content (a file's bytes, a link's target, '' for a directory). */
async function archiveFiles(archive: Readable): Promise<Map<string, string>> {
  const files = new Map<string, string>();
  const parser = new Parser();
  parser.on('entry', (entry: ReadEntry) => {
    const chunks: Buffer[] = [];
    entry.on('data', (chunk: Buffer) => chunks.push(chunk));
    entry.on('end', () => {
      if (entry.type === 'File') files.set(entry.path, Buffer.concat(chunks).toString());
      else files.set(entry.path, entry.type === 'Directory' ? '' : (entry.linkpath ?? ''));
    });
  });
  await pipeline(archive, parser);
  return files;
}

/** A tree of FILES files (some a level down) holding `content`; in a host directory, one more only the host has. */
async function fill(dir: string, content: string): Promise<void> {
  await fs.mkdir(path.join(dir, 'sub'), { recursive: true });
  for (let i = 0; i < FILES; i++) await fs.writeFile(path.join(dir, i % 2 ? `f${i}` : `sub/f${i}`), content);
}

test(`a directory swapped with a link to a host directory during ${TRIALS} packs: no host byte in any archive`, async () => {
  const root = await tempDir('pack-race');
  for (const dir of CHECKPOINT_DIRS) await fs.mkdir(path.join(root, dir));
  const workspace = path.join(root, 'workspace');
  await fill(path.join(workspace, 'd'), INSIDE);
  const host = await tempDir('pack-race-host');
  await fill(host, HOST_SECRET);
  await fs.writeFile(path.join(host, 'host-only'), HOST_SECRET);

  const [command, ...args] = swapLoop('d', host);
  const swapper = spawn(command, args, { cwd: workspace, stdio: 'ignore' });
  try {
    await swapping(path.join(workspace, 'd'));
    for (let i = 0; i < TRIALS; i++) {
      const trial = `pack #${i}`;
      tally.start(trial, `${trial}: escaped or unverified`);
      tally.inject();
      let files: Map<string, string> | undefined;
      try {
        files = await archiveFiles(packSandbox(root, CHECKPOINT_DIRS));
      } catch {
        // A walk that fails under the race takes no checkpoint (the release is retried): no escape either.
        figures.packErrors += 1;
      }
      if (files) {
        figures.archives += 1;
        // Only two file contents exist: anything but the sandbox's own is (part of) a host file.
        const leaked = [...files].filter(
          ([name, content]) =>
            content.includes('HOST') || name.endsWith('host-only') || (name.match(/\/f\d+$/) && content !== INSIDE),
        );
        if (leaked.length > 0) {
          figures.escapes += 1;
          continue;
        }
      }
      tally.ok(trial);
    }
  } finally {
    swapper.kill('SIGKILL');
  }
  expect(await fs.readFile(path.join(host, 'host-only'), 'utf8')).toBe(HOST_SECRET);
  writeSummary('pack-race', tally, {
    escapes: figures.escapes,
    archives: figures.archives,
    pack_errors: figures.packErrors,
  });
  expect(figures.escapes).toBe(0);
  // Most packs must produce an archive: a packer that always fails under the race would hide nothing.
  expect(figures.archives).toBeGreaterThan(TRIALS / 2);
  expect(tally.lostItems).toEqual([]);
}, 600_000);
