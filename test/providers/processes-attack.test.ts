import { spawn } from 'node:child_process';
import { byEnvironment, markerEnv } from '../../providers/processes';
import { pidsRunning, uniqueId, waitFor } from './helpers';

// Where the host offers no cgroup v2, a sandbox's processes are found by the
// marker in their environment, which a process can drop or forge. A bwrap
// sandbox lives in its own pid namespace, which none of its processes can leave:
// tracked by it, a process that drops its marker is still frozen and killed, and
// one that forges a neighbour's marker does not become the neighbour's.

test('a bwrap sandbox process that drops or forges its marker is still its sandbox’s', async () => {
  const marker = { sandboxId: uniqueId('sbx-ns'), hostId: uniqueId('host-ns') };
  const neighbour = { sandboxId: uniqueId('sbx-neighbour'), hostId: marker.hostId };
  // Durations no other process on the machine runs with: how the test finds them on the host.
  const token = `${process.pid}${Math.floor(Math.random() * 1e6)}`;
  const dropped = ['sleep', `1${token}`];
  const forged = ['sleep', `2${token}`];
  const forgedEnv = Object.entries(markerEnv(neighbour)).map(([name, value]) => `${name}=${value}`);
  const script = `env -i ${dropped.join(' ')} & env -i ${forgedEnv.join(' ')} ${forged.join(' ')} & wait`;
  const launcher = spawn(
    'bwrap',
    ['--unshare-pid', '--dev-bind', '/', '/', '--proc', '/proc', '--cap-drop', 'ALL', '--', 'sh', '-c', script],
    { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...markerEnv(marker) }, stdio: 'ignore' },
  );
  try {
    await waitFor('both sandbox processes', async () => pidsRunning(dropped).length + pidsRunning(forged).length === 2);
    const [droppedPid] = pidsRunning(dropped);
    const [forgedPid] = pidsRunning(forged);
    const mine = (await byEnvironment.processes(marker)).map((p) => p.pid);
    expect(mine).toEqual(expect.arrayContaining([droppedPid, forgedPid]));
    expect((await byEnvironment.processes(neighbour)).map((p) => p.pid)).not.toContain(forgedPid);
    await byEnvironment.kill(marker);
    expect(pidsRunning(dropped)).toEqual([]);
    expect(pidsRunning(forged)).toEqual([]);
  } finally {
    launcher.kill('SIGKILL');
    for (const pid of [...pidsRunning(dropped), ...pidsRunning(forged)]) process.kill(pid, 'SIGKILL');
  }
});
