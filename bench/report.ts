import type { CheckpointResult } from './checkpoint';
import type { ModeResult } from './cycle';
import { sandboxSideBound, SANDBOX_SIDE, type CpuUse } from './cpu';
import type { BenchResults } from './results';
import type { Summary } from './stats';
import type { WaitingResult } from './waiting';

// BENCHMARKS.md, rendered from bench/results.json only: every figure in it is
// a measured number of the run that wrote it.

const ms = (s: Summary): string => (s.n === 0 ? 'n/a' : `${fmt(s.median)} / ${fmt(s.p95)}`);
const fmt = (n: number): string =>
  Number.isFinite(n) ? (Math.abs(n) >= 100 ? String(Math.round(n)) : String(Math.round(n * 10) / 10)) : 'n/a';
const secs = (n: number): string => `${(n / 1000).toFixed(1)} s`;

function table(header: string[], rows: string[][]): string {
  return [
    `| ${header.join(' | ')} |`,
    `| ${header.map(() => '---').join(' | ')} |`,
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n');
}

const PART_NAMES: Record<string, string> = {
  workflowTaskQueueMs: 'workflow task queue wait',
  workflowTaskRunMs: 'workflow task run',
  otherMs: 'server (between events)',
};

function partName(key: string): string {
  if (PART_NAMES[key]) return PART_NAMES[key];
  if (key.startsWith('queue:')) return `${key.slice(6)} queue wait`;
  if (key.startsWith('run:')) return `${key.slice(4)} run`;
  return key;
}

/** The components of a latency, largest first, excluding the provider's own work. */
function dominant(parts: Record<string, number>, providerKeys: string[]): string {
  const rest = Object.entries(parts)
    .filter(([k, v]) => !providerKeys.includes(k) && v > 0)
    .sort((a, b) => b[1] - a[1]);
  return (
    rest
      .slice(0, 3)
      .map(([k, v]) => `${partName(k)} ${fmt(v)} ms`)
      .join(', ') || 'nothing measurable'
  );
}

function partsCell(parts: Record<string, number>): string {
  return Object.entries(parts)
    .filter(([, v]) => v >= 0.5)
    .sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${partName(k)} ${fmt(v)}`)
    .join('; ');
}

function cycleSection(cycle: ModeResult[]): string {
  if (cycle.length === 0) return '_Not measured in this run (see errors below)._';
  const latency = table(
    [
      'mode',
      'suspend (ms) median / p95',
      'direct release (ms)',
      'overhead ms',
      'ratio',
      'resume (ms) median / p95',
      'direct attach/restore (ms)',
      'overhead ms',
      'ratio',
      'respond call (ms)',
    ],
    cycle.map((c) => [
      c.name,
      ms(c.suspendMs),
      ms(c.baselineSuspendMs),
      fmt(c.suspendOverheadMs),
      `${fmt(c.suspendRatio)}×`,
      ms(c.resumeMs),
      ms(c.baselineResumeMs),
      fmt(c.resumeOverheadMs),
      `${fmt(c.resumeRatio)}×`,
      ms(c.respondCallMs),
    ]),
  );
  const parts = table(
    ['mode', 'suspend: where the time goes (medians, ms)', 'resume: where the time goes (medians, ms)'],
    cycle.map((c) => [c.name, partsCell(c.suspendParts), partsCell(c.resumeParts)]),
  );
  const dominating = cycle
    .map(
      (c) =>
        `- **${c.name}**: suspend overhead ${fmt(c.suspendOverheadMs)} ms, mostly ${dominant(c.suspendParts, ['run:releaseSandbox'])}; ` +
        `resume overhead ${fmt(c.resumeOverheadMs)} ms, mostly ${dominant(c.resumeParts, ['run:restoreSandbox', 'run:sandboxOp'])}.`,
    )
    .join('\n');
  const errors = cycle
    .filter((c) => c.errors.length > 0)
    .map((c) => `- ${c.name}: ${c.errors.length} failed sample(s), first: ${c.errors[0]}`);
  return [
    latency,
    '',
    "**Baseline**: the same provider calls on a `createLocalProvider` instance with the same MinIO checkpoint store, called directly without Temporal, in the same run: `release` (DETACH / TERMINATE / SNAPSHOT_AND_TERMINATE) for suspend, and `attach` (DETACH), `restore` without a checkpoint (TERMINATE: re-provision on the host-persistent workspace) or `restore` with the checkpoint (SNAPSHOT_AND_TERMINATE, same host: the dormant local copy) for resume; each call under a new fence, as a Run's are (the sandbox's state is then written, as in the Run).",
    '',
    '**Definitions** (from the Run\'s history, server timestamps): suspend = the agent step that raised the interaction completed (`agentStep` activity, or its local-activity marker for the scripted driver) → the workflow task that recorded the receipt (`RELEASED`) completed; resume = `respond` update accepted → the first `execInSandbox` after it started. "Respond call" is the client\'s `executeUpdate` round trip. Each cycle waits for RELEASED before answering.',
    '',
    parts,
    '',
    'What dominates the overhead (everything except the provider call itself):',
    '',
    dominating,
    ...(errors.length ? ['', ...errors] : []),
  ].join('\n');
}

function historySection(r: BenchResults): string {
  if (r.history.length === 0) return '_Not measured in this run._';
  const rows = r.history.map((h) => [
    h.name,
    h.eventsPerCycle.map(fmt).join(', '),
    h.workflowTasksPerCycle.map(fmt).join(', '),
    h.bytesPerCycle.map(fmt).join(', '),
    fmt(h.baseEvents),
    String(h.cyclesBeforeContinueAsNew),
    h.limitedBy,
  ]);
  const types = r.history
    .map(
      (h) =>
        `- ${h.name}: ${Object.entries(h.typesPerCycle)
          .map(([t, n]) => `${t} ${fmt(n)}`)
          .join(', ')}`,
    )
    .join('\n');
  return [
    table(
      [
        'mode',
        'events / cycle (per repetition)',
        'workflow tasks / cycle',
        'history bytes / cycle',
        'events outside cycles',
        'cycles before continue-as-new',
        'limited by',
      ],
      rows,
    ),
    '',
    "A cycle is `ask → suspend → respond → resume → exec`. Measured as (Run with K cycles − Run with 1 cycle) / (K − 1), from the server's `historyLength` and `historySizeBytes`; one value per repetition, so equal values mean the count is stable. **Baseline**: Temporal's default continue-as-new suggestion thresholds, `limit.historyCount.suggestContinueAsNew` = 4,096 events and `limit.historySize.suggestContinueAsNew` = 4 MiB (temporalio/temporal `common/dynamicconfig/constants.go`); the Run continues-as-new at the first agent step after the suggestion, carrying its session aggregate.",
    '',
    'Events of one cycle by type:',
    '',
    types,
  ].join('\n');
}

const mib = (bytes: number): string => (Number.isFinite(bytes) ? `${fmt(bytes / MIB)} MiB` : 'n/a');
const MIB = 1024 * 1024;
const ratio = (x: number, base: number): string => `${fmt(x / base)}×`;

/** Entries of results.json written before figure 4 compared against zstd and restic have no `first`. */
function currentCheckpoints(r: BenchResults): CheckpointResult[] {
  return r.checkpoint.filter((c) => (c as Partial<CheckpointResult>).first !== undefined);
}

function firstRow(c: CheckpointResult, restic: boolean): string[] {
  const base = c.tarZstd.ms.median + c.putObjectMs.median;
  return [
    c.workspace,
    String(c.files),
    `${ms(c.first.ms)} (${mib(c.first.bytes)})`,
    `${fmt(c.tarZstd.ms.median)} + ${fmt(c.putObjectMs.median)} = ${fmt(base)} (${mib(c.tarZstd.bytes)})`,
    ratio(c.first.ms.median, base),
    ...(restic
      ? c.resticFirst
        ? [`${ms(c.resticFirst.ms)} (${mib(c.resticFirst.bytes)})`, ratio(c.first.ms.median, c.resticFirst.ms.median)]
        : ['n/a', 'n/a']
      : []),
  ];
}

function restoreRow(c: CheckpointResult, restic: boolean): string[] {
  const base = c.getObjectMs.median + c.untarMs.median;
  return [
    c.workspace,
    ms(c.crossHostRestoreMs),
    `${fmt(c.getObjectMs.median)} + ${fmt(c.untarMs.median)} = ${fmt(base)}`,
    ratio(c.crossHostRestoreMs.median, base),
    ...(restic
      ? c.resticRestoreMs
        ? [ms(c.resticRestoreMs), ratio(c.crossHostRestoreMs.median, c.resticRestoreMs.median)]
        : ['n/a', 'n/a']
      : []),
  ];
}

function incrementalRows(c: CheckpointResult, restic: boolean): string[][] {
  return c.incremental.map((i) => [
    c.workspace,
    i.change,
    ms(i.stasis.ms),
    `${fmt(i.stasis.bytes / 1024)} KiB (packs ${fmt(i.stasisPackBytes / 1024)} KiB)`,
    `${fmt((100 * i.stasis.ms.median) / c.first.ms.median)}%`,
    ...(restic
      ? i.restic
        ? [ms(i.restic.ms), `${fmt(i.restic.bytes / 1024)} KiB`, ratio(i.stasis.ms.median, i.restic.ms.median)]
        : ['n/a', 'n/a', 'n/a']
      : []),
  ]);
}

function checkpointSection(r: BenchResults): string {
  const cks = currentCheckpoints(r);
  if (cks.length === 0) return '_Not measured in this run._';
  const restic = cks.some((c) => c.resticFirst !== undefined);
  const resticCols = (...cols: string[]) => (restic ? cols : []);
  const errors = cks.filter((c) => c.errors.length > 0).map((c) => `- ${c.workspace}: ${c.errors[0]}`);
  return [
    '**First snapshot + upload** of a running sandbox:',
    '',
    table(
      [
        'workspace',
        'files',
        'snapshot + upload (ms, sent)',
        'baseline `tar \\| zstd -1 -T0` + PutObject (ms, archive)',
        'ratio',
        ...resticCols('baseline `restic backup`, new repository (ms, uploaded)', 'ratio'),
      ],
      cks.map((c) => firstRow(c, restic)),
    ),
    '',
    '**Cross-host restore** (no local copy on the second host):',
    '',
    table(
      [
        'workspace',
        'restore (ms)',
        'baseline volume ‖ GetObject + `zstd -d \\| tar -x` + sync (ms)',
        'ratio',
        ...resticCols('baseline `restic restore` (ms)', 'ratio'),
      ],
      cks.map((c) => restoreRow(c, restic)),
    ),
    '',
    '**Re-suspend after a same-host resume** and a change (bytes sent to the store):',
    '',
    table(
      [
        'workspace',
        'change',
        'suspend (ms)',
        'sent',
        'of the first suspend',
        ...resticCols('baseline `restic backup`, incremental (ms)', 'restic uploaded', 'ratio'),
      ],
      cks.flatMap((c) => incrementalRows(c, restic)),
    ),
    '',
    "Mixed workspaces are half large incompressible files (16 MiB each) and half 16 KiB text-like source files; the `node_modules`-like tree is small text-like files of 200 B to 8 KiB, 40 to a package. Snapshot + upload is the local provider's `release(SNAPSHOT_AND_TERMINATE)` of a running sandbox (freeze, walk, content-defined chunking, hashing, zstd packs, upload to MinIO, manifest, kill); restore is `restore` on a second host (manifest, packs, verification, extraction, swap into place, start). \"Sent\" counts every byte the provider's store received (packs and manifest). **Baselines**, same bytes (the sandbox's `workspace`, `home` and `envs` directories), same run, same MinIO: GNU `tar -cf - | zstd -q -1 -T0` to a file, then one `PutObject` of that file; the other way one `GetObject` to a file while a fresh sandbox volume like the one the restore creates is made (loop-mounted ext4; a plain directory of the same filesystem where the host cannot mount one), then `zstd -d | tar -x` onto it and `sync -f` of it, as the restore makes its volume during its downloads and syncs the restored files before it records the restore (the first column is GetObject and the volume together, the second extraction and sync); and restic " +
      '(`restic backup` to a repository in the same bucket, `restic restore latest --no-cache` into an empty directory, and for every change an incremental `restic backup` of the same tree right after the suspend, the growth of its repository in the bucket as bytes). Both hosts keep sandboxes on their own volumes, the worker’s default. Ours and the `tar`/`zstd` baselines run right after each other, ours first in even repetitions and the baselines first in odd ones, so a swing of the machine’s load hits both. Medians / p95 in ms.',
    '',
    'Each re-suspend row follows a same-host resume from the dormant copy, then the change, then `release` again: "unchanged" changes nothing; "one small file" rewrites the first small file; "1 MiB appended" appends 1 MiB of random bytes to a 16 MiB file; "checkout" rewrites 5% of the small files, deletes 1% and adds 1%. The rows run in that order, each on the result of the one before.',
    ...(errors.length ? ['', ...errors] : []),
  ].join('\n');
}

/** Issue 17's target for Stasis ÷ bare throughput. */
const THROUGHPUT_TARGET = 0.8;

/** The phase's sandboxSideBound (bench/cpu.ts), when both it and its bare run have CPU figures. */
function boundOf(t: BenchResults['throughput'][number]): number | undefined {
  if (!t.cpu || !t.bare?.cpu) return undefined;
  return Math.round(100 * sandboxSideBound(t.cpu, t.completed, t.bare.cpu, t.bare.completed)) / 100;
}

/** "50 concurrent Runs", "50 concurrent DETACH Runs". */
function runsLabel(t: BenchResults['throughput'][number]): string {
  return `${t.concurrency} concurrent ${t.mode === 'DETACH' ? 'DETACH ' : ''}Runs`;
}

function throughputSection(r: BenchResults): string {
  if (r.throughput.length === 0) return '_Not measured in this run._';
  const sdk = (t: BenchResults['throughput'][number], key: string) => (t.sdk[key] ? fmt(t.sdk[key].meanMs) : 'n/a');
  const rows = r.throughput.map((t) => [
    String(t.concurrency),
    t.mode ?? 'SNAPSHOT_AND_TERMINATE',
    `${t.completed} / ${t.failed}`,
    secs(t.wallMs),
    fmt(t.cyclesPerSecond),
    t.bare ? fmt(t.bare.cyclesPerSecond) : 'n/a',
    t.ratioToBare !== undefined ? `${fmt(t.ratioToBare)}×` : 'n/a',
    boundOf(t) !== undefined ? `${boundOf(t)!.toFixed(2)}×` : 'n/a',
    String(t.peakRssMiB),
    ms(t.suspendMs),
    ms(t.resumeMs),
    sdk(t, 'workflow_task_schedule_to_start_latency'),
    sdk(t, 'workflow_task_execution_latency'),
    Object.entries(t.sdk)
      .filter(([k]) => k.startsWith('activity_schedule_to_start_latency'))
      .map(([k, v]) => `${k.replace('activity_schedule_to_start_latency', '').replace(/[{}]/g, '')} ${fmt(v.meanMs)}`)
      .join(', '),
    `${t.leftovers.processes} / ${t.leftovers.workspaces}`,
    String(t.leftovers.checkpointObjects),
  ]);
  return [
    table(
      [
        'concurrent Runs',
        'release',
        'completed / failed',
        'wall',
        'full cycles/s',
        'bare Temporal cycles/s',
        'Stasis ÷ bare',
        'best Stasis ÷ bare the sandbox side leaves',
        'worker peak RSS MiB',
        'suspend under load (ms, 10-Run sample)',
        'resume under load (ms)',
        'SDK: workflow task schedule-to-start, mean ms',
        'SDK: workflow task execution, mean ms',
        'SDK: activity schedule-to-start by type, mean ms',
        'leftover processes / sandbox dirs',
        'checkpoint objects in the store after',
      ],
      rows,
    ),
    '',
    "Each Run is `exec → ask → suspend (SNAPSHOT_AND_TERMINATE, 4 KiB workspace) → respond → resume → exec → complete`; the DETACH row is the same cycle released by DETACH at the first size (no snapshot, no volume unmounted or mounted again, no restore: the orchestration alone, against its own bare run); all N started at once on one worker (default SDK slot counts); the bench answers each Run as soon as visibility shows it `RELEASED` and `WAITING` (polled every 200 ms, so answering adds up to ~0.2 s per Run). Wall = first start → last Run closed. RSS is this process, which holds the worker, its workflow cache and the bench driver (peak by `VmHWM` after resetting it through `/proc/self/clear_refs`, cross-checked by a 100 ms sampler). **Baselines**: the single-Run cycle of figure 1 (one Run at a time) — the same cycle's suspend/resume latency here shows what concurrency adds; and bare Temporal, right after each size on the same server and connection with the same worker settings: a workflow (`bench/bare-workflow.ts`) with the same Update, and the same activities (on the shared and on a host queue) and local activities in the same steps, before and after the answer, as a Stasis Run of this phase had (read from its history: what each of its workflow tasks completed with; those of one step run side by side, as the Run's webhook delivery runs beside its release), each doing nothing, all N started at once and answered by their Update by the same loop as the Stasis Runs, once visibility shows them waiting (the bare workflow sets the same two search attributes when it waits). Leftovers are counted after the phase by scanning `/proc` for the sandbox marker environment of the worker's host, and the host's `sandboxes/` directory. " +
      `**Best ratio the sandbox side leaves**: with both cores busy, cycles/s go as 1 ÷ CPU per cycle; a bare cycle's CPU is all of its phase's CPU ÷ its cycles, and a Stasis cycle, even if its orchestration cost exactly a bare cycle's, adds the CPU of parts bare never runs: ${Object.values(SANDBOX_SIDE).join(', ')} (the sandbox's commands, the mkfs, mount and umount of its volume, and the store), ÷ its cycles. bare ÷ (bare + that) is the most Stasis ÷ bare can reach on this machine; the worker's own provider work (on its main thread, with the SDK's) is left out, so the real bound is lower.`,
    ...r.throughput.filter((t) => t.errors.length > 0).map((t) => `- ${runsLabel(t)}: ${t.errors[0]}`),
    ...r.throughput.flatMap((t) => failureLines(runsLabel(t), t.failures)),
    ...r.throughput.flatMap((t) => cpuLines(`running ${runsLabel(t)}`, t.cpu)),
    ...r.throughput.flatMap((t) => profileLines(t)),
  ].join('\n');
}

/** Where a waiting Run's memory goes, part by part (bench/memory.ts). */
function memoryLines(x: WaitingResult): string[] {
  const m = x.memory;
  if (!m) return [];
  const p = m.perRun;
  const kib = (v: number | undefined) => `${Math.round((v ?? 0) * 1024)} KiB`;
  return [
    '',
    `**Where a waiting Run's memory goes** (${m.halfRuns} → ${x.runs} Runs waiting, each heap after a full GC; per Run added): RSS ${kib(p.rssMiB)}; ` +
      `workflow threads' V8 heap ${kib(p.threadHeapMiB)} (live objects ${kib(p.threadHeapUsedMiB)}); main thread's V8 heap ${kib(p.mainHeapMiB)} (live ${kib(p.mainHeapUsedMiB)}); ` +
      `outside any V8 heap (the SDK core in Rust, malloc, code) ${kib(p.outsideV8MiB)}. With 0 Runs: RSS ${m.base.rssMiB} MiB, ` +
      `workflow threads' heap ${m.base.threadHeapMiB ?? '?'} MiB, main heap ${m.base.mainHeapMiB} MiB, outside V8 ${m.base.outsideV8MiB} MiB; ` +
      `all ${x.runs} waiting: RSS ${m.all.rssMiB} MiB, ${m.all.threadHeapMiB ?? '?'}, ${m.all.mainHeapMiB} and ${m.all.outsideV8MiB} MiB.`,
  ];
}

function waitingSection(r: BenchResults): string {
  const rows = [...(r.waiting ? [r.waiting] : []), ...(r.waitingMore ?? [])];
  const w = rows[0];
  if (!w) return '_Not measured in this run._';
  return [
    table(
      [
        'suspended Runs (planned)',
        'start → all suspended',
        'processes held',
        'worker RSS MiB: 0 Runs → all waiting → all completed',
        'per waiting Run over 0 Runs, MiB',
        'per waiting Run, second half (after a full GC)',
        'peak RSS MiB',
        'dev-server database MiB (growth)',
        'answer all (respond calls)',
        'answers/s',
        'answer → all completed',
        'completed / failed',
        'leftover processes / sandbox dirs',
      ],
      rows.map((x) => [
        `${x.runs} (${x.target})`,
        secs(x.suspendAllMs),
        String(x.processesHeld),
        x.rssBaseMiB === undefined
          ? String(x.rssWhileWaitingMiB)
          : `${x.rssBaseMiB} → ${x.rssWhileWaitingMiB} → ${x.rssAfterMiB}`,
        // Two decimals: the target (0.15 MiB) is below what one shows.
        x.perRunMiB === undefined ? '' : x.perRunMiB.toFixed(2),
        x.memory ? `${fmt(x.memory.perRun.rssMiB * 1024)} KiB (${x.memory.halfRuns} → ${x.runs} Runs)` : '',
        String(x.peakRssMiB),
        `${fmt(x.databaseMiB)} (+${fmt(x.databaseGrowthMiB)})`,
        secs(x.answerAllMs),
        fmt(x.answersPerSecond),
        secs(x.completeAllMs),
        `${x.completed} / ${x.failed}`,
        `${x.leftovers.processes} / ${x.leftovers.workspaces}`,
      ]),
    ),
    '',
    'Runs `ask → exec → complete` on an active (host-persistent) workspace, so they suspend with TERMINATE and hold no process while they wait; started with at most 150 of them not yet released at a time, and no more once those started could not be suspended, answered and completed in the time left at the rate seen. Answers are `respond` updates, 50 in flight. RSS is the bench process, which holds the worker (its workflow cache is `STASIS_MAX_CACHED_WORKFLOWS`, 1,000 by default: a Run evicted while it waits replays its history when answered); "0 Runs" is measured just before the phase starts its first Run. The database is the dev server\'s SQLite file (with its WAL) while all Runs wait. **Baseline**: holding a waiting agent without Stasis keeps its sandbox\'s processes alive — one or more processes and their memory per waiting Run (here ' +
      `${w.runs} processes); with Stasis the cost is ${w.processesHeld} processes, and the Runs' state lives in Temporal.`,
    ...rows.flatMap((x) => [
      ...memoryLines(x),
      ...x.errors.map((e) => `- ${e}`),
      ...failureLines(`${x.runs} waiting Runs`, x.failures),
      ...cpuLines(`suspending ${x.runs} Runs`, x.cpuSuspending),
      ...cpuLines(`answering and completing ${x.runs} Runs`, x.cpuAnswering),
    ]),
  ].join('\n');
}

/** Figure 5 of the last `--waiting-scale` run: the sizes a full run's budget cannot reach. */
function longWaitingSection(long: BenchResults | undefined): string[] {
  if (!long || (!long.waiting && !long.waitingMore?.length)) return [];
  return [
    '',
    `### 5b. Scale of waiting, long run (\`${long.command}\`)`,
    '',
    `Its own run, not the one above: ${long.date}${long.commit ? `, commit \`${long.commit.slice(0, 12)}\`` : ''}, ${secs(long.durationMs)}, ` +
      `load average ${long.machine.loadAtStart.join(' / ')} → ${long.loadAtEnd.join(' / ')}; same machine, same setup, figure 5 alone.`,
    '',
    waitingSection(long),
    ...(long.notMeasured.length ? ['', ...long.notMeasured.map((n) => `- Not measured: ${n}`)] : []),
    ...Object.entries(long.phaseErrors).map(([k, v]) => `- Phase failed: ${k}: \`${v.split('\n')[0]}\``),
  ];
}

/** A CPU part as it reads in a sentence: "the worker's main thread …", "the Temporal dev server". */
function partPhrase(part: string): string {
  if (part.startsWith('worker: ')) return `the worker's ${part.slice('worker: '.length)}`;
  return part === 'MinIO' ? part : `the ${part}`;
}

/** Where the machine's CPU went during a phase, by process and worker thread (results of older runs have no `cpu`). */
function cpuLines(what: string, cpu: CpuUse | undefined): string[] {
  if (!cpu) return [];
  return [
    '',
    `**CPU while ${what}** (from \`/proc\`, ${fmt(cpu.wallS)} s wall, ${fmt(cpu.cores)} of the 2 cores busy on average): ` +
      `${cpu.parts.map((p) => `${p.part} ${fmt(p.cpuS)} s`).join(', ')}.`,
  ];
}

/** Where the worker's main thread spent a profiled phase. */
function profileLines(t: BenchResults['throughput'][number]): string[] {
  const p = t.profile;
  if (!p) return [];
  const pct = (ms: number) => `${Math.round((100 * ms) / Math.max(1, p.wallMs))}%`;
  return [
    '',
    `**Where the worker's time went** with ${t.concurrency} concurrent Runs (V8 CPU profile of the bench process, which hosts the worker, 1 ms sampling, over the whole phase): ` +
      `${secs(p.wallMs)} of main-thread time, ${pct(p.idleMs)} idle (waiting for work), ${pct(p.gcMs)} garbage collection.`,
    '',
    `- Self time by area: ${p.selfByArea
      .filter((a) => a.area !== '(garbage collector)')
      .slice(0, 8)
      .map((a) => `${a.area} ${pct(a.ms)}`)
      .join(', ')}.`,
    `- Inside Stasis code (callees included): ${p.inclusiveOurs
      .slice(0, 6)
      .map((f) => `${f.fn} ${pct(f.ms)}`)
      .join(', ')}.`,
  ];
}

/** Why Runs did not complete, each reason with its count (results of older runs have no `failures`). */
function failureLines(what: string, failures: Record<string, number> | undefined): string[] {
  const entries = Object.entries(failures ?? {}).sort((a, b) => b[1] - a[1]);
  if (entries.length === 0) return [];
  return [
    '',
    `Runs that did not complete (${what}), by reason:`,
    '',
    ...entries.map(([reason, n]) => `- ${n} × ${reason}`),
  ];
}

/**
 * BENCHMARKS.md from one run's results; `long`, when given, is the last `--waiting-scale` run, whose
 * figure 5 rows are shown after this run's with their own date, commit and load.
 */
export function renderMarkdown(r: BenchResults, long?: BenchResults): string {
  const m = r.machine;
  return [
    '# Stasis benchmarks',
    '',
    `Generated by \`${r.command}\` — do not edit by hand; every number below comes from \`bench/results.json\` of that run. Benchmarks measure; they never fail on a time.`,
    '',
    table(
      ['', ''],
      [
        ['date', r.date],
        ['command', `\`${r.command}\` (${r.mode} mode, ${secs(r.durationMs)})`],
        ['machine', `${m.cpuModel}, ${m.cores} cores, ${m.ramGiB} GiB RAM, ${m.platform}, kernel ${m.kernel}`],
        [
          'runtime',
          `Node ${m.node}; Temporal CLI ${r.servers.temporalCli} dev server (SQLite), MinIO ${r.servers.minio}; all on this machine`,
        ],
        [
          'setup',
          'servers started once per bench run (own temp dir, free ports, stopped at the end); one Stasis worker in the bench process; the typed client',
        ],
        ['figures', 'median / p95 over the repetitions, in ms unless marked'],
        [
          'load average (1/5/15 min) at start → end',
          `${m.loadAtStart.join(' / ')} → ${r.loadAtEnd.join(' / ')} (other engineers' test runs share these 2 cores; a load above 2 means the figures include waiting for CPU)`,
        ],
        [
          'sandbox/server processes still alive when the worker stopped (then killed by the bench)',
          String(r.processesLeftBehind),
        ],
      ],
    ),
    '',
    '## 1. Suspend and resume latency of one cycle, per pause mode',
    '',
    cycleSection(r.cycle),
    '',
    '## 2. Throughput: concurrent Runs on one worker',
    '',
    throughputSection(r),
    '',
    '## 3. History cost of a suspend/resume cycle',
    '',
    historySection(r),
    '',
    '## 4. Checkpoint speed',
    '',
    checkpointSection(r),
    '',
    '## 5. Scale of waiting',
    '',
    waitingSection(r),
    ...longWaitingSection(long),
    '',
    '## Findings',
    '',
    ...findings(r),
    '',
    '## Improvements made because of these numbers',
    '',
    ...IMPROVEMENTS,
    '',
    '## Not measured',
    '',
    ...(r.notMeasured.length ? r.notMeasured.map((n) => `- ${n}`) : ['- Everything planned was measured.']),
    ...NOT_MEASURED_ALWAYS,
    ...(Object.keys(r.phaseErrors).length
      ? [
          '',
          '## Phases that failed',
          '',
          ...Object.entries(r.phaseErrors).map(([k, v]) => `- ${k}: \`${v.split('\n')[0]}\``),
        ]
      : []),
    '',
  ].join('\n');
}

/** What the figures of this run say, with the numbers taken from it. */
function findings(r: BenchResults): string[] {
  const out: string[] = [];
  const detach = r.cycle.find((c) => c.mode === 'DETACH');
  if (detach) {
    out.push(
      `- **The fixed cost of orchestration** is what DETACH shows, where the provider does almost nothing (direct release ${fmt(detach.baselineSuspendMs.median)} ms): ` +
        `suspend ${fmt(detach.suspendMs.median)} ms and resume ${fmt(detach.resumeMs.median)} ms. It is a chain of workflow tasks and activity dispatches ` +
        `(suspend: ${partsCell(detach.suspendParts)}; resume: ${partsCell(detach.resumeParts)}); resume also runs one agent step before the first job.`,
    );
  }
  const big = r.cycle.filter((c) => c.mode === 'SNAPSHOT_AND_TERMINATE').sort((a, b) => b.bytes - a.bytes)[0];
  if (big) {
    out.push(
      `- **Large snapshots are dominated by the provider**, not by Temporal: ${big.name} suspend ${fmt(big.suspendMs.median)} ms against ${fmt(big.baselineSuspendMs.median)} ms direct ` +
        `(ratio ${fmt(big.suspendRatio)}×). Same-host resume reuses the dormant copy, so it costs about what DETACH costs.`,
    );
  }
  for (const ck of currentCheckpoints(r)) {
    const base = ck.tarZstd.ms.median + ck.putObjectMs.median;
    const back = ck.getObjectMs.median + ck.untarMs.median;
    const unchanged = ck.incremental.find((i) => i.change.startsWith('unchanged'));
    const slower = ck.incremental
      .filter((i) => i.restic && i.stasis.ms.median > i.restic.ms.median)
      .map((i) => i.change);
    out.push(
      `- **Checkpoints of ${ck.workspace}**: first snapshot + upload ${ratio(ck.first.ms.median, base)} \`tar | zstd -1 -T0\` + PutObject (target ≤ 1.0×), ` +
        `cross-host restore ${ratio(ck.crossHostRestoreMs.median, back)} volume ‖ GetObject + \`zstd -d | tar -x\` + sync (target ≤ 1.2×)` +
        (unchanged
          ? `; an unchanged re-suspend after a resume sent ${fmt(unchanged.stasisPackBytes)} bytes of packs and ${fmt(unchanged.stasis.bytes - unchanged.stasisPackBytes)} of manifest in ${fmt((100 * unchanged.stasis.ms.median) / ck.first.ms.median)}% of the first suspend's time (target 0 and ≤ 5%)`
          : '') +
        (ck.incremental.some((i) => i.restic)
          ? slower.length
            ? `; slower than restic's incremental backup on: ${slower.join(', ')}.`
            : "; at least as fast as restic's incremental backup on every change."
          : '.'),
    );
  }
  const tp = r.throughput.filter((t) => t.mode !== 'DETACH').at(-1);
  if (tp) {
    const s = (key: string) => (tp.sdk[key] ? `${fmt(tp.sdk[key].meanMs)} ms` : 'n/a');
    const profiledPhase = r.throughput.find((t) => t.profile);
    const p = profiledPhase?.profile;
    const busy = p ? Math.round((100 * (p.wallMs - p.idleMs)) / Math.max(1, p.wallMs)) : undefined;
    const top = tp.cpu?.parts[0];
    const cpuTotal = tp.cpu?.parts.reduce((sum, part) => sum + part.cpuS, 0) ?? 0;
    out.push(
      `- **Throughput is bounded by this 2-core machine**, which the worker shares with the dev server (SQLite), MinIO and the sandboxes: with ${tp.concurrency} concurrent Runs ` +
        `a workflow task waited ${s('workflow_task_schedule_to_start_latency')} to start and took ${s('workflow_task_execution_latency')}, and an activity waited ` +
        `${s('activity_schedule_to_start_latency')}.` +
        (top && tp.cpu
          ? ` ${fmt(tp.cpu.cores)} of the 2 cores were busy on average; the largest share went to ${partPhrase(top.part)} ` +
            `(${fmt(top.cpuS)} of ${fmt(cpuTotal)} CPU seconds).`
          : '') +
        (p && profiledPhase
          ? ` The profile of the ${profiledPhase.concurrency}-Run phase shows the worker's main thread busy ${busy}% of the time, and inside Stasis code ` +
            `${p.inclusiveOurs
              .slice(0, 2)
              .map((f) => `${f.fn} ${Math.round((100 * f.ms) / Math.max(1, p.wallMs))}%`)
              .join(' and ')} of it (see figure 2).`
          : ''),
    );
    const bounded = r.throughput.filter((t) => boundOf(t) !== undefined && t.ratioToBare !== undefined);
    const below = bounded.filter((t) => boundOf(t)! < THROUGHPUT_TARGET);
    if (bounded.length > 0)
      out.push(
        `- **Stasis ÷ bare Temporal throughput** was ${bounded.map((t) => `${fmt(t.ratioToBare!)}× (${runsLabel(t)})`).join(', ')}; the target is ${THROUGHPUT_TARGET}×. ` +
          `The sandbox side alone (its processes, their starter, the store) leaves at most ${bounded.map((t) => `${boundOf(t)!.toFixed(2)}×`).join(', ')} on this machine` +
          (below.length > 0
            ? `: for ${below.map(runsLabel).join(', ')} no change to the orchestration can reach the target here, only cheaper sandbox work (or a machine where it does not share the cores with Temporal) can.`
            : "; the rest of the gap is the orchestration and the worker's own provider work."),
      );
  }
  const w = r.waiting;
  if (w && w.runs > 0) {
    const top = w.cpuAnswering?.parts[0];
    out.push(
      `- **Waiting Runs cost memory and database, not processes**: ${w.runs} suspended Runs held ${w.processesHeld} sandbox processes; the worker held ${w.rssWhileWaitingMiB} MiB ` +
        (w.perRunMiB === undefined
          ? `(its workflow cache; about ${fmt(w.rssWhileWaitingMiB / w.runs)} MiB per Run)`
          : `(${w.rssBaseMiB} MiB with 0 Runs; about ${w.perRunMiB.toFixed(2)} MiB per waiting Run over that)`) +
        ` and the dev server's database grew ${fmt(w.databaseGrowthMiB)} MiB ` +
        `(about ${fmt((1024 * w.databaseGrowthMiB) / w.runs)} KiB per Run). Answering all of them ran at ${fmt(w.answersPerSecond)} answers/s` +
        (top ? `, and the largest share of the CPU went to ${partPhrase(top.part)}.` : '.'),
    );
  }
  const failed = [
    ...r.throughput.map((t) => ({ what: runsLabel(t), n: t.failed, failures: t.failures })),
    ...(r.waiting
      ? [{ what: `${r.waiting.runs} waiting Runs`, n: r.waiting.failed, failures: r.waiting.failures }]
      : []),
  ];
  const withFailures = failed.filter((f) => f.n > 0);
  if (failed.length > 0) {
    out.push(
      withFailures.length === 0
        ? `- **No Run failed** in the load phases (${failed.map((f) => f.what).join(', ')}).`
        : `- **Runs failed under load**: ${withFailures
            .map(
              (f) =>
                `${f.n} of the ${f.what} (${
                  Object.keys(f.failures ?? {})
                    .slice(0, 2)
                    .join('; ') || 'reason not recorded'
                })`,
            )
            .join('; ')}. Each reason is listed under its figure.`,
    );
  }
  return out.length ? out : ['- No phase produced figures.'];
}

/** Prose, not figures: what was changed in the product because of a measurement. */
const IMPROVEMENTS: string[] = [
  '- **Worker metrics writes no longer crash the worker** (`workers/worker.ts`). The first bench run died with an unhandled `ENOENT` from `rename`: the worker writes its metrics file every 2 s, ' +
    'and while a 64 MiB snapshot kept the event loop busy for longer than that, two writes overlapped on the same temporary file name. Writes are now chained (never overlapping), ' +
    'each uses its own temporary name, and a failed write is logged instead of taking the process down.',
  '- **A busy host is not a dead host** (`workflows/coordinator.ts`). In the first full run, 450 of 500 waiting Runs answered at once ended FAILED: provider calls had a 30 s schedule-to-start ' +
    'and a 10 s heartbeat timeout, and a host with hundreds of calls queued looked dead. Calls now wait up to 10 min for their host and heartbeat within 30 s; only a restore falls back to another host after 30 s.',
  "- **The process scan no longer dominates provider calls** (`providers/processes.ts`). A CPU profile of 50 concurrent Runs (`node --cpu-prof dist/bench/main.js --only=2`) put 53 s of the worker's " +
    '196 s busy main-thread time in `scanSandboxProcesses`, 27 s of it allocating a fresh 64 KiB buffer per `/proc` file read. The scan now reads into one reused buffer and remembers each ' +
    "process's marker by pid and start time; the same 50-Run phase went from 108-129 s to 46-73 s, and provider activities from seconds to hundreds of milliseconds.",
  '- **A lost exec attempt no longer fails the Run** (`providers/jobs.ts`). With the scan fixed, the remaining failures under load were `execInSandbox: activity Heartbeat timeout`, the attempt ' +
    "never having heartbeated at all (the bench now records each failed Run's reason and the timeline of the activity that timed out): an attempt lost on its way to or from the worker. " +
    'Jobs ran once by design, so the Run failed. Exec is now retried like every provider call, and a per-sandbox job journal makes the retry safe: a finished job returns its outcome, ' +
    'a running one is joined, and one an earlier worker process started is refused (`JOB_INTERRUPTED`) instead of running twice.',
  '- **Completed Runs no longer leave checkpoints in the store** (`providers/local.ts`, `stores/`). An earlier run counted 85 objects under `checkpoints/` after the throughput phases, whose ' +
    'Runs had all ended: destroying a sandbox now deletes every checkpoint under its prefix, and a checkpoint key is fixed per release request, so a retry after a killed upload replaces ' +
    'what that attempt left (object and unfinished multipart upload).',
  '- **Sandbox processes are started by a small helper process** (`providers/spawner.ts`). The previous profile of 50 concurrent Runs put 22% of the main thread in `spawnInSandbox`: ' +
    "Node's `spawn` forks the whole worker synchronously, and a fork here took a median 10 ms at 43 MiB, 48 ms at 1 GiB and 85 ms at 2 GiB (30 `spawn('/bin/true')` each); " +
    'the worker holds 2-3 GiB of workflow cache with a thousand waiting Runs. The helper is forked once and stays small. A 200-Run waiting phase (suspend, answer, complete) ' +
    "went from 122 to 56 CPU seconds in the worker (its SDK core threads from 40 to 9 s: after every fork the kernel copied each page the worker's threads wrote; the main thread from 37 to 21 s) " +
    'and from 135 to 105 s wall. In the full bench: 50 concurrent Runs 46.8 s → 28.3 s; waiting Runs suspended within the ramp 1,040 → 1,329, answered and completed at 1.9 → 2.7 Runs/s.',
  "- **Workflow code loads no zod** (`common/wire-checks.ts`, `workers/worker.ts`). An earlier round preloaded zod with the SDK's `preloadModules` and reported it loaded once per worker " +
    "thread; that was wrong: zod is marked side-effect-free, webpack compiles it into the workflow modules, and every Run's V8 context still built zod and our schemas " +
    "(about 1 MiB of heap per Run, the same with and without the preload). What a waiting Run costs the worker now is figure 5's “per waiting Run” column. The workflow's update validators and signals now use hand-written checks that a property test holds to the zod schemas, and a test fails if zod is in the bundle.",
  "- **A sized workflow cache** (`STASIS_MAX_CACHED_WORKFLOWS`, 1,000 by default). The SDK's default (about 2,300 here) kept every waiting Run cached; a Run evicted while it waits replays its history when answered.",
  "- **Fewer history events per cycle** (behind `patched()`, so earlier histories replay): one search-attribute upsert per workflow task, none of what the Run was started with, and the scripted driver's steps as local activities (one marker instead of three events and a workflow task).",
  "- **The dev server's SQLite runs in WAL mode** (`platform/temporal-server.ts`, so `npm start`, the tests and the bench alike). The CPU accounting by process added in this round showed the " +
    'dev server as the largest user (0.7 core) while only 1.4 of the 2 cores were busy: it writes through one SQLite connection, and in the default rollback-journal mode each commit waited on ' +
    'several fsyncs. With `journal_mode=wal` and `synchronous=normal` (safe against a crash of the server, not of the machine) the same 200-Run phase went from 105 to 46 s wall and the ' +
    "dev server's CPU from 77 to 33 s.",
  "- **The bench loads the server less**: its visibility polls name the phase's Runs (`WorkflowId STARTS_WITH`) instead of listing every Run of the bench every 200 ms.",
  "- **Where a waiting Run's memory goes, measured** (`bench/memory.ts`, `bench/waiting-probe.ts`). The 0.6 MiB per waiting Run of an earlier quick run was RSS over 0 Runs, warm-up included. " +
    "Split by part after a full GC of every heap (the SDK's workflow thread wrapped so it reports its own V8 heap), 400 Runs suspended in steps of 100 with the default cache: the first 100 " +
    "added 1.15 MiB each (JIT code, heaps and the SDK core's buffers growing to the ramp's 150 Runs in flight), each later one 0.44 MiB: 0.19 MiB of live objects in the workflow thread's " +
    "V8 heap (the Run's cached workflow state), 0.05 MiB on the main thread, the rest heap headroom V8 keeps and memory outside V8 (the SDK core, malloc). With no workflow cache " +
    '(`STASIS_MAX_CACHED_WORKFLOWS=0`) 200 waiting Runs added 0.26 MiB each over 0 Runs, most of it the same warm-up: a waiting Run evicted from the cache costs the worker little. ' +
    "With a cache of 100 (`STASIS_MAX_CACHED_WORKFLOWS=100`), the Runs from 100 to 300 waiting added 0.05 MiB each (RSS 422 → 432 MiB, the workflow thread's live heap flat at 41 MiB): " +
    'a Run beyond the cache costs the worker a tenth of a cached one, so the cache is best sized to the Runs active at once, not to those waiting (the default stays 1,000; a smaller one ' +
    'replays the history of every Run answered after eviction). Figure 5 now reports both the cost over 0 Runs and the marginal cost (half → all Runs), and the parts.',
  "- **A cached Run no longer instantiates Stasis's workflow modules** (`workers/worker.ts`, `preloadModules`). The SDK runs every workflow of a thread in one V8 context but gives each its own " +
    "instance of every module loaded after the bundle started: each cached Run held its own copy of Stasis's workflow code (functions, closures, constant tables, the hashing library). " +
    'Heap snapshots of the workflow thread (`bench/waiting-probe.ts --snapshots`, `bench/heap-diff.ts`) with 100 and 300 cached waiting Runs: 146.5 KiB of objects per Run before, 59.7 KiB after ' +
    "(the workflow thread's live heap 0.141 → 0.058 MiB per Run; RSS 1.10 → 0.36 MiB per Run from 100 to 300 waiting, both at load average 12-14 on the shared 2 cores, so the RSS figures are noisy). " +
    "The modules are now loaded once per thread and shared, frozen by the SDK; a test fails if one of them gains module state. What remains per cached Run is mostly the SDK's: about 10 KiB of " +
    "stack traces it keeps for every pending promise (its stack-trace query, always on), its per-workflow copy of the context's globals (5 KiB), the Run's promises and timers, and outside V8 the SDK core's state of the Run.",
  '- **Provider calls no longer scan all of /proc where there is no cgroup** (`providers/processes.ts`). The process starter reports each process it starts; a look at a sandbox reads ' +
    'its known processes, their descendants, and the children of init, the worker and its ancestors (where orphans go), re-reading only pids handed out since the last look. With 1,145 ' +
    'processes on the machine (500 of them orphans of init) finding a 3-process sandbox took 3.1 ms instead of 58 ms (50 calls each, load average 13). Where the worker can create ' +
    'cgroup v2 groups (as on this machine and the CI machine) sandboxes are tracked by their group as before.',
  "- **Host maintenance no longer keeps every Temporal call it made** (`workers/maintenance.ts`, `providers/processes.ts`). The first 2,000-Run figure 5b showed the worker's main-thread heap growing 60 KiB of live objects per waiting Run (RSS 280 → 737 MiB waiting, 818 MiB after all completed). Heap snapshots of the main thread (`bench/waiting-probe.ts --main-snapshots`, `bench/heap-retainers.ts`) traced it to host maintenance: every pass ran under one `AbortController` living as long as the worker, and the Temporal client hangs an `abort` listener holding the call on the signal of every call it makes, never removed, so every describe and query of every pass stayed (2 to 4 per sandbox a minute). Each pass and each sandbox's calls now get their own signal; and a killed sandbox's entries leave the process index (with cgroups nothing walked it). 300 waiting Runs with a 100-Run cache, old and new build side by side (load 8 → 4): main heap per Run from 100 to 300 waiting +52 KiB → about 0, after all completed +72 KiB → +2.4 KiB.",
];

const NOT_MEASURED_ALWAYS: string[] = [
  '- The `bwrap` provider, AWS S3, a PostgreSQL-backed Temporal cluster and more than one worker: the bench measures the one-machine setup (dev server, local provider, MinIO).',
];
