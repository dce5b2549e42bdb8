/** count, median, 95th percentile and maximum of a sample (nearest-rank); zeros for no samples. */
export function percentiles(samples: number[]): { count: number; p50: number; p95: number; max: number } {
  if (samples.length === 0) return { count: 0, p50: 0, p95: 0, max: 0 };
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
  return { count: sorted.length, p50: at(0.5), p95: at(0.95), max: sorted[sorted.length - 1] };
}
