import { spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { CHECKPOINT_DIRS, DEFAULT_ARCHIVE_LIMITS } from '../../stores/archive';
import { takeCheckpoint } from '../../stores/cas/upload';
import { FsCheckpointStore } from '../../stores/fs';
import { swapLoop, swapping, tempDir, uniqueId } from '../providers/helpers';
import { listNoFollow, restoreFresh } from '../stores/cas-helpers';
import { Tally, writeSummary } from './helpers';

// Area cas-pack-race: while content-addressed checkpoints are taken, a process of
// the sandbox that escaped its freeze swaps (renameat2 exchange), as fast as it can,
// a workspace directory with a link to a host directory, and a file with a FIFO.
// No checkpoint may hold a byte or a name of a host file, and none may hang on the FIFO.

const tally = new Tally();
const figures = { escapes: 0, checkpoints: 0, takeErrors: 0 };
const leaks: string[] = [];
const TRIALS = 60;
// Of one length, so bytes from one file in place of the other still show as a leak.
const INSIDE = 'inside-content-of-the-sandbox';
const HOST_SECRET = 'HOST-SECRET-CONTENT-OF-A-HOST';
const FILES = 20;

async function fill(dir: string, content: string): Promise<void> {
  await fs.mkdir(path.join(dir, 'sub'), { recursive: true });
  for (let i = 0; i < FILES; i++) await fs.writeFile(path.join(dir, i % 2 ? `f${i}` : `sub/f${i}`), content);
}

/** A loop exchanging `name` with a FIFO beside it, forever. */
function fifoSwapLoop(name: string): string[] {
  const script = [
    'use POSIX; my ($n) = @ARGV; my $f = "$n.fifo"; mkfifo($f, 0644) or die "mkfifo: $!";',
    'my $renameat2 = $Config{archname} =~ /aarch64/ ? 276 : 316;',
    'while (1) { syscall($renameat2, -100, $n, -100, $f, 2) == 0 or die "renameat2: $!"; }',
  ].join(' ');
  return ['perl', '-MConfig', '-e', script, name];
}

/** path → content (a file's bytes, a link's target, '' for a directory) of every restored entry. */
async function restoredFiles(dir: string): Promise<Map<string, string>> {
  const files = new Map<string, string>();
  for (const relative of await listNoFollow(dir)) {
    const file = path.join(dir, relative);
    const stat = await fs.lstat(file);
    if (stat.isSymbolicLink()) files.set(relative, await fs.readlink(file));
    else if (stat.isFile()) files.set(relative, await fs.readFile(file, 'utf8'));
    else files.set(relative, '');
  }
  return files;
}

test(`a directory swapped with a host link and a file with a FIFO during ${TRIALS} checkpoints: no host byte, no hang`, async () => {
  const root = await tempDir('cas-pack-race');
  for (const dir of CHECKPOINT_DIRS) await fs.mkdir(path.join(root, dir));
  const workspace = path.join(root, 'workspace');
  await fill(path.join(workspace, 'd'), INSIDE);
  await fs.writeFile(path.join(workspace, 'swapped'), INSIDE);
  const host = await tempDir('cas-pack-race-host');
  await fill(host, HOST_SECRET);
  await fs.writeFile(path.join(host, 'host-only'), HOST_SECRET);
  const store = new FsCheckpointStore(await tempDir('cas-pack-race-store'));

  const swappers = [swapLoop('d', host), fifoSwapLoop('swapped')].map(([command, ...args]) =>
    spawn(command, args, { cwd: workspace, stdio: 'ignore' }),
  );
  try {
    await swapping(path.join(workspace, 'd'));
    for (let i = 0; i < TRIALS; i++) {
      const trial = `checkpoint #${i}`;
      tally.start(trial, `${trial}: escaped or unverified`);
      tally.inject();
      let files: Map<string, string> | undefined;
      try {
        const taken = await takeCheckpoint({
          store,
          rootDir: root,
          names: CHECKPOINT_DIRS,
          prefix: 'checkpoints/race/',
          name: uniqueId('t'),
          labels: {},
          limits: DEFAULT_ARCHIVE_LIMITS,
          progress: { bytes: 0 },
        });
        const { target } = await restoreFresh(store, taken.checkpoint);
        files = await restoredFiles(target);
        await fs.rm(target, { recursive: true, force: true });
      } catch {
        // A walk that fails under the race takes no checkpoint (the release is retried): no escape either.
        figures.takeErrors += 1;
      }
      if (files) {
        figures.checkpoints += 1;
        // Only two file contents exist: anything but the sandbox's own is (part of) a host file.
        const leaked = [...files].filter(
          ([name, content]) =>
            content.includes('HOST') ||
            name.endsWith('host-only') ||
            (/(\/f\d+|swapped)$/.test(name) && !name.endsWith('.link') && content !== INSIDE && content !== host),
        );
        if (leaked.length > 0) {
          figures.escapes += 1;
          leaks.push(...leaked.map(([name, content]) => `${trial}: ${name} = ${JSON.stringify(content.slice(0, 80))}`));
          continue;
        }
      }
      tally.ok(trial);
    }
  } finally {
    for (const swapper of swappers) swapper.kill('SIGKILL');
  }
  expect(await fs.readFile(path.join(host, 'host-only'), 'utf8')).toBe(HOST_SECRET);
  writeSummary('cas-pack-race', tally, {
    escapes: figures.escapes,
    checkpoints: figures.checkpoints,
    take_errors: figures.takeErrors,
  });
  expect(leaks.slice(0, 10)).toEqual([]);
  expect(figures.escapes).toBe(0);
  // Most checkpoints must be taken: an uploader that always fails under the race would hide nothing.
  expect(figures.checkpoints).toBeGreaterThan(TRIALS / 2);
  expect(tally.lostItems).toEqual([]);
}, 600_000);
