import { readFileSync } from 'node:fs';

// What one more cached Run holds in a workflow thread's V8 heap, by kind of object:
// `node dist/bench/heap-diff.js <fewer.heapsnapshot> <more.heapsnapshot> <runs between> [top]`
// compares two snapshots bench/waiting-probe.ts took (`--snapshots=<dir>`) and prints, per
// (node type, name), the objects and self bytes each Run added. An experiment, not a figure.

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
  nodes: number[];
  strings: string[];
}

/** Self bytes and count by `type name` (closures by function name, objects by constructor). */
export function tally(file: string): Map<string, { count: number; bytes: number }> {
  const snap = JSON.parse(readFileSync(file, 'utf8')) as Snapshot;
  const fields = snap.snapshot.meta.node_fields;
  const types = snap.snapshot.meta.node_types[0];
  const width = fields.length;
  const [typeAt, nameAt, sizeAt] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f));
  const out = new Map<string, { count: number; bytes: number }>();
  for (let i = 0; i < snap.nodes.length; i += width) {
    const type = types[snap.nodes[i + typeAt]];
    let name = snap.strings[snap.nodes[i + nameAt]] ?? '';
    // Strings and code by type alone: their "names" are their contents.
    if (type === 'string' || type === 'concatenated string' || type === 'sliced string' || type === 'code') name = '';
    if (type === 'number' || type === 'hidden' || type === 'array') name = name.slice(0, 40);
    const key = `${type} ${name.slice(0, 80)}`;
    const entry = out.get(key) ?? { count: 0, bytes: 0 };
    entry.count += 1;
    entry.bytes += snap.nodes[i + sizeAt];
    out.set(key, entry);
  }
  return out;
}

function main(): void {
  const [a, b, runsArg, topArg] = process.argv.slice(2);
  const runs = Number(runsArg);
  if (!a || !b || !(runs > 0)) {
    process.stderr.write('usage: heap-diff <fewer.heapsnapshot> <more.heapsnapshot> <runs between> [top]\n');
    process.exit(2);
  }
  const before = tally(a);
  const after = tally(b);
  const rows = [...after.entries()].map(([key, v]) => {
    const w = before.get(key) ?? { count: 0, bytes: 0 };
    return { key, count: (v.count - w.count) / runs, bytes: (v.bytes - w.bytes) / runs };
  });
  const total = rows.reduce((s, r) => s + r.bytes, 0);
  rows.sort((x, y) => y.bytes - x.bytes);
  process.stdout.write(`per Run: ${Math.round(total)} bytes (${(total / 1024).toFixed(1)} KiB) of self size\n`);
  for (const r of rows.slice(0, Number(topArg ?? 40)))
    process.stdout.write(
      `${Math.round(r.bytes).toString().padStart(8)} B ${r.count.toFixed(2).padStart(8)}  ${r.key}\n`,
    );
}

if (require.main === module) main();
