import * as fsSync from 'node:fs';
import { Worker } from 'node:worker_threads';

// Warming a sandbox's file metadata ahead of a checkpoint's walk. Right after a volume is mounted
// (a resume mounts it again) none of its directory blocks and inodes are cached, and the walk reads
// them one synchronous call at a time, each waiting on the disk: 20,000 files took ~500 ms to walk
// cold against ~180 ms warm (2 cores, load 6). A thread that only lists directories and looks names
// up runs ahead of the walk meanwhile, so the walk mostly finds them cached. It reads nothing the
// walk uses and follows no link (as the walk: descriptors, O_NOFOLLOW); it stops when told.

/**
 * Lists the directories of the trees `names` under `rootDir` and looks up each entry (which reads its
 * inode; in a directory found cached, see `cachedNs`, only its subdirectories and its first two other
 * names), until done or `stop[0]` is set; returns how many entries it looked up. A top name is
 * followed (the worker's own path, as in the walk); below it nothing is: a directory is opened with
 * O_PATH|O_NOFOLLOW and listed through its descriptor's magic link, anything else only lstat'ed.
 *
 * Self-contained (no imports, no closures over this module): it runs in the warming thread from its source text.
 */
export function warmTrees(
  fs: typeof fsSync,
  rootDir: string,
  names: readonly string[],
  stop: Int32Array,
  cachedNs = 15_000,
): number {
  const O_PATH = 0o10000000;
  const { O_DIRECTORY, O_NOFOLLOW } = fs.constants;
  let looked = 0;
  const visit = (dir: number): void => {
    // Names as bytes: one that is not UTF-8 is reached by its bytes (as a string it would spell U+FFFD
    // and open nothing, or another entry).
    let entries: fsSync.Dirent<Buffer>[];
    try {
      entries = fs.readdirSync(`/proc/self/fd/${dir}`, { withFileTypes: true, encoding: 'buffer' });
    } catch {
      return;
    }
    const prefix = Buffer.from(`/proc/self/fd/${dir}/`);
    // A directory whose first two names took under cachedNs each to look up is taken as cached (a cold
    // inode waits on the disk): its other names are left to the walk. Looking up 20,000 cached names
    // cost this thread ~150-290 ms of CPU a first snapshot, beside a walk that needed none of it.
    let quick = 0;
    for (const entry of entries) {
      if (Atomics.load(stop, 0) !== 0) return;
      const where = Buffer.concat([prefix, entry.name]);
      if (!entry.isDirectory()) {
        if (quick >= 2) continue;
        looked += 1;
        const start = process.hrtime.bigint();
        try {
          fs.lstatSync(where);
        } catch {
          // gone meanwhile
        }
        quick = Number(process.hrtime.bigint() - start) < cachedNs ? quick + 1 : -Infinity;
        continue;
      }
      looked += 1;
      let child: number;
      try {
        child = fs.openSync(where, O_PATH | O_NOFOLLOW | O_DIRECTORY);
      } catch {
        continue; // gone, or swapped for something else meanwhile
      }
      try {
        if (fs.fstatSync(child).isDirectory()) visit(child);
      } finally {
        fs.closeSync(child);
      }
    }
  };
  for (const name of names) {
    let top: number;
    try {
      top = fs.openSync(`${rootDir}/${name}`, O_PATH | O_DIRECTORY);
    } catch {
      continue;
    }
    try {
      visit(top);
    } finally {
      fs.closeSync(top);
    }
  }
  return looked;
}

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const fs = require('node:fs');
const warmTrees = (${warmTrees.toString()});
parentPort.on('message', ({ rootDir, names, stop, cachedNs }) => {
  let looked = 0;
  try {
    looked = warmTrees(fs, rootDir, names, stop, cachedNs);
  } catch {
    // Only a head start is lost.
  }
  parentPort.postMessage(looked);
});
`;

let thread: Worker | undefined;
/** The warm-ups sent to the thread, in order (it answers each, in turn, with the entries it looked up). */
const answers: ((looked: number) => void)[] = [];

/**
 * Starts warming the metadata of `names` under `rootDir` in the warming thread (started once, then
 * kept). `stop` stops it: call it once the walk is over. `looked` settles with the entries it
 * looked up (0 if it failed). Best effort: a thread that fails is started again next time.
 */
export function warmMetadata(
  rootDir: string,
  names: readonly string[],
  /** See warmTrees (0: every name is looked up). */
  cachedNs?: number,
): { stop: () => void; looked: Promise<number> } {
  const stop = new Int32Array(new SharedArrayBuffer(4));
  let worker: Worker;
  try {
    worker = thread ?? startThread();
  } catch {
    return { stop: () => undefined, looked: Promise.resolve(0) };
  }
  const looked = new Promise<number>((resolve) => answers.push(resolve));
  worker.postMessage({ rootDir, names, stop, cachedNs });
  return { stop: () => Atomics.store(stop, 0, 1), looked };
}

function startThread(): Worker {
  const started = new Worker(WORKER_SOURCE, { eval: true });
  started.on('message', (looked: number) => answers.shift()?.(looked));
  const forget = () => {
    if (thread !== started) return;
    thread = undefined;
    for (const answer of answers.splice(0)) answer(0);
  };
  started.on('error', forget);
  started.on('exit', forget);
  // Never holds the process open (a warm-up cut short loses nothing); after the listeners, which would.
  started.unref();
  thread = started;
  return started;
}
