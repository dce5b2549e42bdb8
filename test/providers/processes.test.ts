import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { byEnvironment, markerEnv } from '../../providers/processes';
import { uniqueId } from './helpers';

// Finding a sandbox's processes by their marker (the fallback where the host offers no
// cgroup v2), with real processes. The scan remembers markers between scans; these are
// the cases where remembering could go wrong.

const markers: { sandboxId: string; hostId: string }[] = [];
afterAll(async () => {
  for (const marker of markers) await byEnvironment.kill(marker);
});

function newMarker() {
  const marker = { sandboxId: uniqueId('proc'), hostId: uniqueId('host') };
  markers.push(marker);
  return marker;
}

function start(script: string, env: Record<string, string>): number {
  const child = spawn('/bin/sh', ['-c', script], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
    detached: true,
    stdio: 'ignore',
  });
  child.unref();
  return child.pid!;
}

// The script waits for the gate file before it execs, so a scan is sure to see it before
// the exec however loaded the machine is (a fixed sleep raced a slow first scan).
const gates = mkdtempSync(join(tmpdir(), 'stasis-proc-gates-'));
function gated(then: string): { script: string; open: () => void } {
  const gate = join(gates, uniqueId('gate'));
  return { script: `while [ ! -e '${gate}' ]; do sleep 0.05; done; exec ${then}`, open: () => writeFileSync(gate, '') };
}

/** Waits until `pid` runs `sleep 60` (its exec happened). */
async function execed(pid: number): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    if (cmdline === 'sleep\x0060\x00') return;
    await sleep(50);
  }
  throw new Error(`process ${pid} did not exec sleep 60 in 30 s`);
}

it('keeps finding a marked process after it execs without the marker', async () => {
  const marker = newMarker();
  const gate = gated('env -i sleep 60');
  const pid = start(gate.script, markerEnv(marker));
  expect((await byEnvironment.processes(marker)).map((p) => p.pid)).toContain(pid); // the waiting shell
  gate.open();
  await execed(pid); // now `sleep 60` with an empty environment, same process
  expect((await byEnvironment.processes(marker)).map((p) => p.pid)).toEqual([pid]);
  await byEnvironment.kill(marker);
  expect(await byEnvironment.processes(marker)).toEqual([]);
});

it('finds a child of this process that gains its marker by exec after a scan saw it without one', async () => {
  const marker = newMarker();
  const env = Object.entries(markerEnv(marker))
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  const gate = gated(`env ${env} sleep 60`);
  const pid = start(gate.script, {});
  expect(await byEnvironment.processes(marker)).toEqual([]);
  gate.open();
  await execed(pid);
  expect((await byEnvironment.processes(marker)).map((p) => p.pid)).toEqual([pid]);
  await byEnvironment.kill(marker);
  expect(await byEnvironment.processes(marker)).toEqual([]);
});
