import { spawn } from 'node:child_process';
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

it('keeps finding a marked process after it execs without the marker', async () => {
  const marker = newMarker();
  const pid = start('sleep 0.4; exec env -i sleep 60', markerEnv(marker));
  expect((await byEnvironment.processes(marker)).map((p) => p.pid)).toContain(pid); // the shell (and its `sleep 0.4`)
  await sleep(800); // now `sleep 60` with an empty environment, same process
  expect((await byEnvironment.processes(marker)).map((p) => p.pid)).toEqual([pid]);
  await byEnvironment.kill(marker);
  expect(await byEnvironment.processes(marker)).toEqual([]);
});

it('finds a child of this process that gains its marker by exec after a scan saw it without one', async () => {
  const marker = newMarker();
  const env = Object.entries(markerEnv(marker))
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  const pid = start(`sleep 0.4; exec env ${env} sleep 60`, {});
  expect(await byEnvironment.processes(marker)).toEqual([]);
  await sleep(800);
  expect((await byEnvironment.processes(marker)).map((p) => p.pid)).toEqual([pid]);
  await byEnvironment.kill(marker);
  expect(await byEnvironment.processes(marker)).toEqual([]);
});
