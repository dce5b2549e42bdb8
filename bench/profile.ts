import { Session } from 'node:inspector/promises';
import * as path from 'node:path';

// A CPU profile of this process (the worker's main thread, which runs every
// activity and feeds the workflow thread) while a phase runs, summed into where
// the time went: what dominates under load is measured, not guessed.

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string };
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileSummary {
  wallMs: number;
  /** The event loop waiting for work. */
  idleMs: number;
  gcMs: number;
  /** Self time by area (code of ours by file, libraries by package, Node by module). */
  selfByArea: { area: string; ms: number }[];
  /** Time inside our own functions, callees included, the largest first. */
  inclusiveOurs: { fn: string; ms: number }[];
}

const ROOT = path.resolve(__dirname, '..');

function areaOf(url: string, functionName: string): string {
  if (url === '')
    return functionName === '(idle)' || functionName === '(garbage collector)'
      ? functionName
      : 'native (V8, libuv, syscalls)';
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (pkg) return pkg[1].startsWith('@temporalio/') ? 'Temporal SDK' : pkg[1];
  if (url.startsWith('node:')) return url;
  const file = url.replace(/^file:\/\//, '');
  return file.startsWith(ROOT) ? path.relative(ROOT, file).replace(/\.js$/, '.ts') : 'other';
}

function isOurs(url: string): boolean {
  const file = url.replace(/^file:\/\//, '');
  return file.startsWith(ROOT) && !file.includes('node_modules') && !file.includes(`${path.sep}bench${path.sep}`);
}

export function summarizeProfile(profile: CpuProfile): ProfileSummary {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<number, number>();
  profile.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const areas = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let wall = 0;
  for (const [id, us] of self) {
    wall += us;
    const frame = byId.get(id)!.callFrame;
    const area = areaOf(frame.url, frame.functionName);
    areas.set(area, (areas.get(area) ?? 0) + us);
    // Each of our functions on the stack counts once per sample.
    const seen = new Set<string>();
    for (let n: number | undefined = id; n !== undefined; n = parent.get(n)) {
      const f = byId.get(n)!.callFrame;
      if (!isOurs(f.url)) continue;
      const name = `${f.functionName || '(anonymous)'} (${areaOf(f.url, f.functionName)})`;
      if (seen.has(name)) continue;
      seen.add(name);
      inclusive.set(name, (inclusive.get(name) ?? 0) + us);
    }
  }
  const ms = (us: number) => Math.round(us / 1000);
  const top = <K extends string>(m: Map<string, number>, key: K, n: number) =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, us]) => ({ [key]: name, ms: ms(us) }) as Record<K, string> & { ms: number });
  return {
    wallMs: ms(wall),
    idleMs: ms(areas.get('(idle)') ?? 0),
    gcMs: ms(areas.get('(garbage collector)') ?? 0),
    selfByArea: top(areas, 'area', 12).filter((a) => a.area !== '(idle)'),
    inclusiveOurs: top(inclusive, 'fn', 10),
  };
}

/** Runs `fn` under the V8 CPU profiler (1 ms sampling) and summarizes where the main thread's time went. */
export async function profiled<T>(fn: () => Promise<T>): Promise<{ value: T; profile: ProfileSummary }> {
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 1000 });
  await session.post('Profiler.start');
  try {
    const value = await fn();
    const { profile } = (await session.post('Profiler.stop')) as { profile: CpuProfile };
    return { value, profile: summarizeProfile(profile) };
  } finally {
    session.disconnect();
  }
}
