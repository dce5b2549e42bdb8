// The Temporal SDK's own worker metrics (Prometheus text from the runtime we
// installed): mean task latencies over a phase, as the difference of two scrapes
// of each histogram's _sum and _count.

export const SDK_LATENCIES = [
  'temporal_workflow_task_schedule_to_start_latency',
  'temporal_workflow_task_execution_latency',
  'temporal_workflow_task_replay_latency',
  'temporal_activity_schedule_to_start_latency',
  'temporal_activity_execution_latency',
  'temporal_workflow_endtoend_latency',
] as const;

export type SdkScrape = Map<string, { sum: number; count: number }>;

export async function scrapeSdk(url: string): Promise<SdkScrape> {
  const text = await (await fetch(url)).text();
  const out: SdkScrape = new Map();
  for (const line of text.split('\n')) {
    const match = /^([a-z_]+)_(sum|count)(\{[^}]*\})? ([0-9.eE+-]+)$/.exec(line);
    if (!match) continue;
    const [, name, kind, labels, value] = match;
    // Activity latencies by activity type; the rest summed over labels.
    const activity = /activity_type="([^"]+)"/.exec(labels ?? '')?.[1];
    const key = name.startsWith('temporal_activity_') && activity ? `${name}{${activity}}` : name;
    const entry = out.get(key) ?? { sum: 0, count: 0 };
    entry[kind as 'sum' | 'count'] += Number(value);
    out.set(key, entry);
  }
  return out;
}

export interface SdkLatency {
  count: number;
  meanMs: number;
}

/** Mean latency per metric between two scrapes (metrics in milliseconds). */
export function sdkDelta(before: SdkScrape, after: SdkScrape): Record<string, SdkLatency> {
  const result: Record<string, SdkLatency> = {};
  for (const [key, now] of after) {
    if (!SDK_LATENCIES.some((name) => key.startsWith(name))) continue;
    const was = before.get(key) ?? { sum: 0, count: 0 };
    const count = now.count - was.count;
    if (count <= 0) continue;
    result[key.replace(/^temporal_/, '')] = { count, meanMs: Math.round(((now.sum - was.sum) / count) * 10) / 10 };
  }
  return result;
}
