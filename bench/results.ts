import type { CheckpointResult } from './checkpoint';
import type { ModeResult } from './cycle';
import type { HistoryCost } from './history-cost';
import type { MachineInfo } from './machine';
import type { ThroughputResult } from './throughput';
import type { WaitingResult } from './waiting';

// The shape of bench/results.json, which BENCHMARKS.md is rendered from.

export interface BenchResults {
  command: string;
  mode: 'quick' | 'full' | 'waiting-scale';
  /** The commit measured (`git rev-parse HEAD`), when the run is in a git checkout. */
  commit?: string;
  date: string;
  machine: MachineInfo;
  servers: { temporalCli: string; minio: string };
  durationMs: number;
  cycle: ModeResult[];
  history: HistoryCost[];
  checkpoint: CheckpointResult[];
  throughput: ThroughputResult[];
  /** Scale of waiting at the plan's first size, and at the larger sizes the budget allowed. */
  waiting?: WaitingResult;
  waitingMore?: WaitingResult[];
  /** Figures not measured in this run, and why. */
  notMeasured: string[];
  /** A phase that failed as a whole: its error. */
  phaseErrors: Record<string, string>;
  /** After the servers were stopped: processes of this run still alive (servers and every sandbox host used). */
  processesLeftBehind: number;
  /** Load averages when the results were last written. */
  loadAtEnd: number[];
}
