import { closeSync, openSync, readdirSync, readSync } from 'node:fs';

// Reading /proc: what the process index (processes.ts) and the process starter (spawner.ts) both need.
// Files are read synchronously, into one reused buffer: they are generated in memory and never block,
// and a fresh buffer per read made allocation the cost of a scan.

/**
 * A thread of `pid` other than its main one that has not exited, with its stat fields. The main thread can
 * exit alone (SYS_exit, pthread_exit): /proc/<pid>/stat then shows a zombie while the process runs on.
 */
export function liveThread(pid: number): { tid: string; fields: string[] } | undefined {
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return undefined;
  }
  for (const tid of tids) {
    if (tid === String(pid)) continue;
    const stat = readProcFile(`/proc/${pid}/task/${tid}/stat`);
    const fields = stat?.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields && fields[0] !== 'Z' && fields[0] !== 'X') return { tid, fields };
  }
  return undefined;
}

/** PF_KTHREAD in the flags of /proc/<pid>/stat: kernel threads have no environment to read. */
const PF_KTHREAD = 0x00200000;
/** PF_EXITING: set when a process begins to exit, before it leaves its control groups. */
const PF_EXITING = 0x00000004;

/** What /proc/<pid>/stat says of `pid`, or undefined when it is gone. */
export function processStat(pid: number):
  | {
      state: string;
      ppid: number;
      group: number;
      session: number;
      startTime: string;
      kernelThread: boolean;
      exiting: boolean;
      /** Where the main thread exited and another runs on: that thread, whose state and flags these are. */
      thread?: number;
    }
  | undefined {
  const stat = readProcFile(`/proc/${pid}/stat`);
  if (stat === undefined) return undefined;
  // The command name may contain spaces and parentheses; the fields after it start at the last ')'.
  // From there: state (field 3 of proc(5)), ppid (4), process group (5), session (6), flags (9), starttime (22).
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // A zombie main thread with live threads is a running process, to be found, frozen and killed.
  const thread = fields[0] === 'Z' ? liveThread(pid) : undefined;
  const flags = Number(thread?.fields[6] ?? fields[6]);
  return {
    state: thread?.fields[0] ?? fields[0],
    ppid: Number(fields[1]),
    group: Number(fields[2]),
    session: Number(fields[3]),
    startTime: fields[19],
    kernelThread: (flags & PF_KTHREAD) !== 0,
    exiting: (flags & PF_EXITING) !== 0,
    thread: thread && Number(thread.tid),
  };
}

let buffer = Buffer.allocUnsafe(64 * 1024);

/** A /proc file's content (their size is unknown until read), or undefined when it cannot be read. */
export function readProcFile(file: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(file, 'r');
  } catch {
    return undefined;
  }
  try {
    let length = 0;
    for (;;) {
      if (length === buffer.length) {
        const bigger = Buffer.allocUnsafe(buffer.length * 2);
        buffer.copy(bigger);
        buffer = bigger;
      }
      const n = readSync(fd, buffer, length, buffer.length - length, null);
      if (n === 0) return buffer.toString('latin1', 0, length);
      length += n;
    }
  } catch {
    return undefined; // gone meanwhile, or not ours to read
  } finally {
    closeSync(fd);
  }
}
