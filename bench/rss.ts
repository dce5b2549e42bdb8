import { readFileSync, writeFileSync } from 'node:fs';

// The worker runs in this process, so the process's memory is the worker's
// (plus the small bench driver). Peak RSS per phase: the kernel's high-water
// mark VmHWM, reset at the start of a phase by writing 5 to clear_refs, and a
// 100 ms sampler as a cross-check where the reset is not allowed.

function statusKiB(field: 'VmRSS' | 'VmHWM'): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync('/proc/self/status', 'utf8'));
  return match ? Number(match[1]) : 0;
}

export function rssMiB(): number {
  return statusKiB('VmRSS') / 1024;
}

export class PeakRss {
  private sampled = 0;
  private readonly timer: NodeJS.Timeout;
  readonly hwmReset: boolean;

  constructor() {
    let reset: boolean;
    try {
      writeFileSync('/proc/self/clear_refs', '5');
      reset = true;
    } catch {
      reset = false;
    }
    this.hwmReset = reset;
    this.sampled = rssMiB();
    this.timer = setInterval(() => {
      this.sampled = Math.max(this.sampled, rssMiB());
    }, 100);
    this.timer.unref();
  }

  /** Peak RSS in MiB since construction; stops the sampler. */
  stop(): number {
    clearInterval(this.timer);
    const sampled = Math.max(this.sampled, rssMiB());
    return Math.round(this.hwmReset ? Math.max(sampled, statusKiB('VmHWM') / 1024) : sampled);
  }
}
