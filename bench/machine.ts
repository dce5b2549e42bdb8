import { readFileSync } from 'node:fs';
import * as os from 'node:os';

// What the numbers were measured on: printed at the top of BENCHMARKS.md.

export interface MachineInfo {
  cpuModel: string;
  cores: number;
  ramGiB: number;
  node: string;
  platform: string;
  kernel: string;
  /** 1/5/15-minute load averages when the run started: other work on the machine shows here. */
  loadAtStart: number[];
}

export function machineInfo(): MachineInfo {
  const cpus = os.cpus();
  return {
    cpuModel: cpus[0]?.model.trim() ?? 'unknown',
    cores: cpus.length,
    ramGiB: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10,
    node: process.version,
    platform: `${os.type()} ${os.arch()}${debianVersion()}`,
    kernel: os.release(),
    loadAtStart: os.loadavg().map((l) => Math.round(l * 100) / 100),
  };
}

function debianVersion(): string {
  try {
    return ` (Debian ${readFileSync('/etc/debian_version', 'utf8').trim()})`;
  } catch {
    return '';
  }
}
