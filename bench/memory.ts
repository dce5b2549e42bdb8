import { readFileSync } from 'node:fs';
import * as v8 from 'node:v8';
import * as vm from 'node:vm';
import workerThreadsModule from 'node:worker_threads';
import type * as WorkerThreads from 'node:worker_threads';

// The worker's memory by part: its process RSS, the main thread's V8 heap (activities, the
// client, the bench driver), the V8 heaps of the SDK's workflow threads (the Runs' workflow state),
// and what is in no V8 heap (the SDK core in Rust, malloc, code). Figure 5 splits what a waiting
// Run costs this way; `bench/waiting-probe.ts` is the experiment that does the same with settings.

/** One port per workflow thread, answering with that thread's V8 heap statistics. */
const probes: WorkerThreads.MessagePort[] = [];

/**
 * Wraps the SDK's workflow threads so each answers with its heap statistics: must run before
 * the worker is created. The thread runs the SDK's file unchanged after a small preamble.
 */
export function probeWorkflowThreads(): void {
  // The module object itself (a default import; an `import * as` binding may be a copy): the SDK reads `Worker` from it.
  const threads = workerThreadsModule;
  const Original = threads.Worker;
  if ((Original as { probed?: boolean }).probed) return;
  class Probed extends Original {
    static probed = true;
    constructor(file: string | URL, options: WorkerThreads.WorkerOptions = {}) {
      // Only the SDK's workflow threads (a file): Stasis's own threads (the checkpoint hasher's inline
      // source) run as they are; wrapped, their source was taken for a file name and every snapshot failed.
      if (options.eval) {
        super(file, options);
        return;
      }
      const { port1, port2 } = new threads.MessageChannel();
      super(PREAMBLE, {
        ...options,
        eval: true,
        workerData: { probeFile: String(file), probePort: port2 },
        transferList: [port2],
      });
      port1.unref();
      probes.push(port1);
      // A thread that has ended answers no more: asked, it would hang the measurement (figure 5 waited
      // for ever on the threads of figure 2's workers, shut down before it).
      this.once('exit', () => {
        const at = probes.indexOf(port1);
        if (at >= 0) probes.splice(at, 1);
        port1.close();
      });
    }
  }
  (threads as { Worker: typeof WorkerThreads.Worker }).Worker = Probed;
}

// In a block: the thread's global scope may already have a gc function (the flag is process-wide).
const PREAMBLE = `{
  const { workerData } = require('node:worker_threads');
  const v8 = require('node:v8');
  const vm = require('node:vm');
  v8.setFlagsFromString('--expose-gc');
  const collect = vm.runInNewContext('gc');
  const port = workerData.probePort;
  port.on('message', (message) => {
    collect();
    // A heap snapshot when asked for one (a file path): what the thread's objects are, by constructor.
    if (typeof message === 'object' && message.snapshot) v8.writeHeapSnapshot(message.snapshot);
    port.postMessage(v8.getHeapStatistics());
  });
  port.unref();
  require(workerData.probeFile);
}`;

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

/** The thread's heap statistics; undefined if it does not answer in time (it is ending). */
function threadHeap(
  port: WorkerThreads.MessagePort,
  request: 'stats' | { snapshot: string } = 'stats',
  timeoutMs = 10_000,
): Promise<v8.HeapInfo | undefined> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(undefined), timeoutMs);
    port.once('message', (stats: v8.HeapInfo) => {
      clearTimeout(timer);
      resolve(stats);
    });
    port.postMessage(request);
  });
}

/**
 * Writes a heap snapshot of each workflow thread (after a full GC) as `<prefix>-<thread>.heapsnapshot`;
 * returns the files. For bench/heap-diff.ts: what each cached Run holds, by constructor.
 */
export async function snapshotWorkflowThreads(prefix: string): Promise<string[]> {
  const files: string[] = [];
  for (const [i, port] of probes.entries()) {
    const file = `${prefix}-${i}.heapsnapshot`;
    // Writing a snapshot of a large heap takes a while: a minute before the thread counts as gone.
    if (await threadHeap(port, { snapshot: file }, 60_000)) files.push(file);
  }
  return files;
}

export interface WorkerMemory {
  rssMiB: number;
  /** Live objects after a full GC, and the heap V8 holds for them (what counts in RSS). */
  mainHeapUsedMiB: number;
  mainHeapMiB: number;
  /** All workflow threads together; undefined when the threads were not probed. */
  threadHeapUsedMiB?: number;
  threadHeapMiB?: number;
  /** RSS not in a V8 heap: the SDK core (Rust), malloc, code, stacks. */
  outsideV8MiB: number;
}

const mib = (bytes: number) => Math.round((bytes / (1024 * 1024)) * 10) / 10;

/** The process's memory by part, after a full GC of every heap. */
export async function workerMemory(): Promise<WorkerMemory> {
  gc();
  const threads = (await Promise.all(probes.map((port) => threadHeap(port)))).filter((t) => t !== undefined);
  const main = v8.getHeapStatistics();
  const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync('/proc/self/status', 'utf8'));
  const rssMiB = Math.round((match ? Number(match[1]) : 0) / 1024);
  const threadTotal = threads.reduce((s, t) => s + t.total_heap_size, 0);
  return {
    rssMiB,
    mainHeapUsedMiB: mib(main.used_heap_size),
    mainHeapMiB: mib(main.total_heap_size),
    ...(threads.length > 0
      ? { threadHeapUsedMiB: mib(threads.reduce((s, t) => s + t.used_heap_size, 0)), threadHeapMiB: mib(threadTotal) }
      : {}),
    outsideV8MiB: Math.round(rssMiB - mib(main.total_heap_size + threadTotal)),
  };
}

/** What each of `runs` more Runs added, part by part, from `from` to `to`. */
export function perRun(from: WorkerMemory, to: WorkerMemory, runs: number): WorkerMemory {
  const d = (a: number | undefined, b: number | undefined) =>
    a === undefined || b === undefined || runs <= 0 ? 0 : Math.round(((b - a) / runs) * 1000) / 1000;
  return {
    rssMiB: d(from.rssMiB, to.rssMiB),
    mainHeapUsedMiB: d(from.mainHeapUsedMiB, to.mainHeapUsedMiB),
    mainHeapMiB: d(from.mainHeapMiB, to.mainHeapMiB),
    threadHeapUsedMiB: d(from.threadHeapUsedMiB, to.threadHeapUsedMiB),
    threadHeapMiB: d(from.threadHeapMiB, to.threadHeapMiB),
    outsideV8MiB: d(from.outsideV8MiB, to.outsideV8MiB),
  };
}
