import { readFileSync } from 'node:fs';

// Where a heap grew, by retainer path: `node dist/bench/heap-retainers.js <fewer> <more> <runs between> [depth]`
// compares two heap snapshots (bench/waiting-probe.ts `--main-snapshots=<dir>`) and prints, at each
// depth from the GC roots, the paths under which the most self size was added per Run. Every object
// counts under its shortest path from the roots (weak edges left out, as the DevTools do), so a map
// that keeps one entry per Run shows as the deepest path still holding most of the growth.
// An experiment, not a figure.

interface RawSnapshot {
  snapshot: {
    meta: {
      node_fields: string[];
      node_types: [string[], ...unknown[]];
      edge_fields: string[];
      edge_types: [string[], ...unknown[]];
    };
  };
  nodes: number[];
  edges: number[];
  strings: string[];
}

/** Self bytes by path prefix (`depth` hops from the root at most). */
export function byPath(file: string, depth: number): Map<string, number> {
  const snap = JSON.parse(readFileSync(file, 'utf8')) as RawSnapshot;
  const meta = snap.snapshot.meta;
  const nw = meta.node_fields.length;
  const ew = meta.edge_fields.length;
  const [typeAt, nameAt, sizeAt, edgeCountAt] = ['type', 'name', 'self_size', 'edge_count'].map((f) =>
    meta.node_fields.indexOf(f),
  );
  const [eTypeAt, eNameAt, eToAt] = ['type', 'name_or_index', 'to_node'].map((f) => meta.edge_fields.indexOf(f));
  const nodeTypes = meta.node_types[0];
  const edgeTypes = meta.edge_types[0];
  const count = snap.nodes.length / nw;
  const firstEdge = new Uint32Array(count + 1);
  for (let n = 0; n < count; n++) firstEdge[n + 1] = firstEdge[n] + snap.nodes[n * nw + edgeCountAt] * ew;

  const label = (n: number): string => {
    const type = nodeTypes[snap.nodes[n * nw + typeAt]];
    if (type === 'string' || type === 'concatenated string' || type === 'sliced string' || type === 'number')
      return `(${type})`;
    if (type === 'code') return '(code)';
    return `${type}:${(snap.strings[snap.nodes[n * nw + nameAt]] ?? '').slice(0, 40)}`;
  };
  const edgeLabel = (e: number): string => {
    const type = edgeTypes[snap.edges[e + eTypeAt]];
    if (type === 'element' || type === 'hidden') return '[]';
    const name = snap.strings[snap.edges[e + eNameAt]] ?? '';
    return /^\d+$/.test(name) ? '[]' : name.slice(0, 40);
  };

  // Shortest paths from the root (node 0), breadth first.
  const parent = new Int32Array(count).fill(-1);
  const via = new Int32Array(count).fill(-1);
  const seen = new Uint8Array(count);
  seen[0] = 1;
  let frontier = [0];
  while (frontier.length > 0) {
    const next: number[] = [];
    for (const n of frontier)
      for (let e = firstEdge[n]; e < firstEdge[n + 1]; e += ew) {
        const type = edgeTypes[snap.edges[e + eTypeAt]];
        if (type === 'weak' || type === 'shortcut') continue;
        const to = snap.edges[e + eToAt] / nw;
        if (seen[to]) continue;
        seen[to] = 1;
        parent[to] = n;
        via[to] = e;
        next.push(to);
      }
    frontier = next;
  }

  const out = new Map<string, number>();
  for (let n = 1; n < count; n++) {
    if (!seen[n]) continue;
    const hops: string[] = [];
    for (let m = n; m > 0; m = parent[m]) hops.push(`${edgeLabel(via[m])}→${label(m)}`);
    hops.reverse();
    const size = snap.nodes[n * nw + sizeAt];
    for (let d = 1; d <= Math.min(depth, hops.length); d++) {
      const key = `${d}|${hops.slice(0, d).join(' ')}`;
      out.set(key, (out.get(key) ?? 0) + size);
    }
  }
  return out;
}

function main(): void {
  const [a, b, runsArg, depthArg] = process.argv.slice(2);
  const runs = Number(runsArg);
  if (!a || !b || !(runs > 0)) {
    process.stderr.write('usage: heap-retainers <fewer.heapsnapshot> <more.heapsnapshot> <runs between> [depth]\n');
    process.exit(2);
  }
  const depth = Number(depthArg ?? '16');
  const before = byPath(a, depth);
  const after = byPath(b, depth);
  const grown = new Map<number, { path: string; bytes: number }[]>();
  for (const [key, bytes] of after) {
    const [d, path] = [Number(key.slice(0, key.indexOf('|'))), key.slice(key.indexOf('|') + 1)];
    const per = (bytes - (before.get(key) ?? 0)) / runs;
    if (per < 256) continue;
    const list = grown.get(d) ?? [];
    list.push({ path, bytes: per });
    grown.set(d, list);
  }
  for (let d = 1; d <= depth; d++) {
    const list = (grown.get(d) ?? []).sort((x, y) => y.bytes - x.bytes).slice(0, Number(process.env.TOP ?? '6'));
    if (list.length === 0) continue;
    process.stdout.write(`depth ${d}:\n`);
    for (const { path, bytes } of list)
      process.stdout.write(
        `  ${Math.round(bytes).toString().padStart(7)} B/Run  …${path.split(' ').slice(-5).join(' ')}\n`,
      );
  }
}

if (require.main === module) main();
