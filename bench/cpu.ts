import { readdirSync, readFileSync } from 'node:fs';
import { spawnerPid } from '../providers/spawner';
import type { BenchEnv } from './env';
import { round } from './stats';

// CPU seconds each part of the one-machine setup used during a phase, from
// /proc: which process (and which thread of the worker) the 2 cores went to.
// The profile only sees the worker's main thread; this sees everything.

export interface CpuUse {
  wallS: number;
  /** CPU seconds by part, the largest first. */
  parts: { part: string; cpuS: number }[];
  /** All parts together, in cores (CPU seconds per second of wall time). */
  cores: number;
}

const TICKS_PER_SECOND = 100;

/** Parts of a phase's CPU that only a Stasis Run uses: what the sandbox runs, what starts it, and the checkpoint store. */
export const SANDBOX_SIDE = {
  starter: 'process starter (Node)',
  processes: 'sandbox processes (reaped)',
  store: 'MinIO',
} as const;

/** CPU seconds of all parts of `cpu`, or of those named. */
export function cpuTotal(cpu: CpuUse, only?: readonly string[]): number {
  return cpu.parts.filter((p) => !only || only.includes(p.part)).reduce((sum, p) => sum + p.cpuS, 0);
}

/**
 * The best Stasis ÷ bare throughput the sandbox-side work leaves on a machine whose cores are all
 * busy (figure 2): if a Stasis cycle's orchestration cost exactly what a bare cycle costs, its CPU
 * per cycle would still be the bare cycle's plus the sandbox side's (SANDBOX_SIDE), which bare never
 * runs. An upper bound: the worker's own provider work (its main thread) is left out, being
 * inseparable there from the SDK's.
 */
export function sandboxSideBound(stasis: CpuUse, stasisCycles: number, bare: CpuUse, bareCycles: number): number {
  const barePerCycle = cpuTotal(bare) / Math.max(1, bareCycles);
  const sidePerCycle = cpuTotal(stasis, Object.values(SANDBOX_SIDE)) / Math.max(1, stasisCycles);
  return barePerCycle / Math.max(1e-9, barePerCycle + sidePerCycle);
}

/** utime + stime (and, with `children`, those of waited-for children) of a /proc stat file, in seconds. */
export function cpuSeconds(statFile: string, children = false): number {
  try {
    const stat = readFileSync(statFile, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // Fields 14-17 of proc(5): utime, stime, cutime, cstime (here 0-based from field 3).
    const own = Number(f[11]) + Number(f[12]);
    return (children ? own + Number(f[13]) + Number(f[14]) : own) / TICKS_PER_SECOND;
  } catch {
    return 0; // gone
  }
}

function threadPart(tid: string, comm: string): string {
  if (Number(tid) === process.pid) return 'worker: main thread (activities, the bench driver)';
  if (comm.startsWith('tokio-runtime') || comm.startsWith('workflow-proces')) return 'worker: SDK core (Rust)';
  return 'worker: other Node threads (workflows, GC, I/O)';
}

function snapshot(env: BenchEnv): Map<string, number> {
  const parts = new Map<string, number>();
  const add = (part: string, s: number) => parts.set(part, (parts.get(part) ?? 0) + s);
  for (const tid of readdirSync('/proc/self/task')) {
    let comm: string;
    try {
      comm = readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim();
    } catch {
      continue; // the thread ended
    }
    add(threadPart(tid, comm), cpuSeconds(`/proc/self/task/${tid}/stat`));
  }
  const starter = spawnerPid();
  // The starter waits for the sandbox processes it started: their CPU shows as its children's.
  if (starter !== undefined) {
    const own = cpuSeconds(`/proc/${starter}/stat`);
    add(SANDBOX_SIDE.starter, own);
    add(SANDBOX_SIDE.processes, cpuSeconds(`/proc/${starter}/stat`, true) - own);
  }
  if (env.temporalServer.pid !== undefined)
    add('Temporal dev server', cpuSeconds(`/proc/${env.temporalServer.pid}/stat`));
  if (env.minioPid !== undefined) add(SANDBOX_SIDE.store, cpuSeconds(`/proc/${env.minioPid}/stat`));
  return parts;
}

export class CpuMeter {
  private readonly start = performance.now();
  private readonly before: Map<string, number>;

  constructor(private readonly env: BenchEnv) {
    this.before = snapshot(env);
  }

  stop(): CpuUse {
    const wallS = (performance.now() - this.start) / 1000;
    const parts = [...snapshot(this.env)]
      .map(([part, s]) => ({ part, cpuS: round(s - (this.before.get(part) ?? 0)) }))
      .filter((p) => p.cpuS > 0)
      .sort((a, b) => b.cpuS - a.cpuS);
    const total = parts.reduce((sum, p) => sum + p.cpuS, 0);
    return { wallS: round(wallS), parts, cores: round(total / Math.max(wallS, 0.001), 2) };
  }
}
