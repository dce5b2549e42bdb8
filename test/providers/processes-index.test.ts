import { spawn } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { killGroup } from '../../providers/cgroups';
import { hostCommands, spawnInSandbox } from '../../providers/command';
import { DEFAULT_LIMITS } from '../../providers/limits';
import { byIndex, markerEnv, sandboxProcesses, trackStarted, type SandboxMarker } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { startProcess } from '../../providers/spawner';
import { pidsRunning, tempDir, uniqueId, waitFor } from './helpers';

// Where the host offers no cgroup, a worker finds a sandbox's processes through its index: what
// its process starter started, their descendants, and orphans that carry the sandbox's marker or
// stay in its sessions. These sandbox processes try to get away: they fork, double-fork (their
// parent exits and they are handed to init), leave their session, drop their marker, rename
// themselves; and a neighbour's process forges the sandbox's marker. Real processes, started
// through the real process starter.

const hostId = uniqueId('host-index');
let dataDir: string;
const started: SandboxMarker[] = [];

beforeAll(async () => {
  dataDir = await tempDir('proc-index');
});
afterAll(async () => {
  for (const marker of started) {
    await byIndex.kill(marker);
    // The index kills by process; the groups each start joined (this host has them) go as a provider's kill removes them.
    await killGroup(marker, 10_000);
  }
});

/** Starts `script` in the sandbox, as a provider starts a background command. */
async function startIn(marker: SandboxMarker, script: string): Promise<number> {
  if (!started.includes(marker)) started.push(marker);
  const paths = sandboxPaths(dataDir, marker.sandboxId);
  mkdirSync(paths.workspace, { recursive: true });
  mkdirSync(paths.home, { recursive: true });
  const child = await spawnInSandbox(hostCommands, paths, ['/bin/bash', '-c', script], {
    sandbox: { marker, limits: DEFAULT_LIMITS },
    env: markerEnv(marker),
    background: true,
  });
  return child.pid;
}

// Durations no other process on the machine runs with: how the test finds each process on the host.
const token = `${process.pid}${Math.floor(Math.random() * 1e5)}`;
const sleeper = (n: number) => `${n}${token}`;
const running = (n: number, argv0 = 'sleep') => pidsRunning([argv0, sleeper(n)]);

// First in the file: processes other tests leave behind would be adopted meanwhile and counted.
test('killed sandboxes leave nothing in the index', async () => {
  const before = byIndex.size();
  for (let round = 0; round < 20; round += 1) {
    const marker = { hostId, sandboxId: uniqueId('sbx-churn') };
    // A command that exits, and one that leaves an orphan in a session of its own.
    await startIn(marker, 'exit 0');
    await startIn(marker, `(setsid sleep ${sleeper(51)} &)`);
    await waitFor('the orphan', async () => (await byIndex.processes(marker)).length > 0);
    await byIndex.kill(marker);
  }
  expect(running(51)).toEqual([]);
  expect(byIndex.size()).toBe(before);
});

test('an orphan in a session of its own, first seen with its environment unreadable (as during execve), is killed once it shows its marker', async () => {
  const marker = { hostId, sandboxId: uniqueId('sbx-exec-window') };
  const assignments = Object.entries(markerEnv(marker))
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  const gate = path.join(dataDir, uniqueId('gate'));
  // Its environment reads empty until the gate opens, then it execs (same pid, same start time) with its marker.
  const gated = `while [ ! -e ${gate} ]; do sleep 0.05; done; exec env ${assignments} sleep ${sleeper(61)}`;
  const script = `(setsid env -i bash -c '${gated}' &)`;
  await startIn(marker, script);
  // Orphaned before the worker first looks, and past `setsid` and `env` (which still carry the
  // marker): the command and its subshell are gone, the gated bash runs with no environment.
  await waitFor(
    'the orphan alone',
    async () => ofScript(script).length === 0 && pidsRunning(['bash', '-c', gated]).length === 1,
  );
  // Looked at while it reads as no sandbox's: no marker, no lineage, no session of the sandbox.
  expect(await byIndex.processes(marker)).toEqual([]);
  writeFileSync(gate, '');
  await waitFor('the orphan with its marker', async () => running(61).length === 1);
  await byIndex.kill(marker);
  expect(running(61)).toEqual([]);
});

test('a sandbox’s forks, double forks and daemons are found and killed whatever they change; a neighbour’s never', async () => {
  const mine = { hostId, sandboxId: uniqueId('sbx') };
  const neighbour = { hostId, sandboxId: uniqueId('sbx-neighbour') };
  const forge = Object.entries(markerEnv(mine))
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  const gate = path.join(dataDir, uniqueId('gate'));
  // The neighbour: a child with its own marker, and an orphan forging `mine`'s marker.
  await startIn(neighbour, `sleep ${sleeper(11)} & (env -i ${forge} sleep ${sleeper(12)} &) ; wait`);
  // A command that exits at once, leaving orphans: one with its marker, one without, a daemon in
  // its own session with its marker, and one in its own session that drops its marker and renames
  // itself only after the worker has seen it (the gate).
  await startIn(
    mine,
    [
      `(sleep ${sleeper(1)} &)`,
      `(env -i sleep ${sleeper(2)} &)`,
      `(setsid sleep ${sleeper(3)} &)`,
      `(setsid bash -c 'while [ ! -e ${gate} ]; do sleep 0.05; done; exec -c -a renamed sleep ${sleeper(4)}' &)`,
      'exit 0',
    ].join('; '),
  );
  // A long-lived command: a fork, a renamed child without environment, and itself exec'd without it.
  await startIn(
    mine,
    `sleep ${sleeper(5)} & bash -c 'exec -c -a renamed sleep ${sleeper(6)}' & exec env -i sleep ${sleeper(7)}`,
  );
  await waitFor('every sandbox process', async () =>
    [running(1), running(2), running(3), running(5), running(6, 'renamed'), running(7), running(11), running(12)].every(
      (pids) => pids.length === 1,
    ),
  );
  // The gated daemon: seen while it still has its marker, then it drops it.
  await waitFor('the gated daemon', async () => {
    const pids = (await byIndex.processes(mine)).map((p) => p.pid);
    return pidsMentioning(gate).some((pid) => pids.includes(pid));
  });
  writeFileSync(gate, '');
  await waitFor('the gated daemon renamed', async () => running(4, 'renamed').length === 1);

  const expected = [running(1), running(2), running(3), running(4, 'renamed'), running(5)]
    .concat([running(6, 'renamed'), running(7)])
    .flat();
  const foreign = [...running(11), ...running(12)];
  const found = (await byIndex.processes(mine)).map((p) => p.pid);
  expect(found).toEqual(expect.arrayContaining(expected));
  for (const pid of foreign) expect(found).not.toContain(pid);
  // A worker's own view (the index, as the worker has a process starter) agrees.
  expect((await sandboxProcesses(mine)).map((p) => p.pid).sort()).toEqual([...found].sort());

  await byIndex.kill(mine);
  for (const pid of expected) expect(alive(pid)).toBe(false);
  expect(await byIndex.processes(mine)).toEqual([]);
  // The neighbour's processes, the one forging `mine`'s marker included, are untouched and its own.
  for (const pid of foreign) expect(alive(pid)).toBe(true);
  expect((await byIndex.processes(neighbour)).map((p) => p.pid)).toEqual(expect.arrayContaining(foreign));
  await byIndex.kill(neighbour);
  for (const pid of foreign) expect(alive(pid)).toBe(false);
});

// Processes that fork and exit as fast as they can: each generation's parent exits, so the live one is
// always new and between two parents while the worker looks. Each shape is killed and frozen several
// times; a tag in the command line finds every process of the script on the host (subshells keep it).
const forkers: { name: string; script: (tag: string) => string }[] = [
  { name: 'a chain that sleeps between forks', script: (tag) => `: ${tag}; f() { sleep 0.01; (f &); }; f; wait` },
  { name: 'a chain that forks as fast as it can', script: (tag) => `: ${tag}; f() { (f &); }; f; sleep 600 & wait` },
  { name: 'a fast chain whose first process exits at once', script: (tag) => `: ${tag}; f() { (f &); }; f` },
  // Job control puts each generation in a process group of its own: only the session holds them.
  {
    name: 'a fast chain that moves to a new group each time',
    script: (tag) => `set -m; : ${tag}; f() { (f &); }; f; wait`,
  },
];

/** Live processes of `script` on the host (a zombie has no command line). */
const ofScript = (script: string) => pidsRunning(['/bin/bash', '-c', script]);

/** Kills what a failed attempt left, so it cannot hurt the tests after it. */
async function sweep(script: string): Promise<void> {
  for (let round = 0; round < 100 && ofScript(script).length > 0; round += 1) {
    for (const pid of ofScript(script)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Starts `script` `times` times in a new sandbox each, runs `check` once it forks, and sweeps what is left. */
async function eachForker(
  times: number,
  script: (tag: string) => string,
  check: (marker: SandboxMarker, tagged: string) => Promise<void>,
): Promise<void> {
  for (let attempt = 0; attempt < times; attempt += 1) {
    const marker = { hostId, sandboxId: uniqueId('sbx-forker') };
    const tagged = script(uniqueId('forker'));
    try {
      await startIn(marker, tagged);
      await waitFor('the forker', async () => ofScript(tagged).length > 0);
      await check(marker, tagged);
    } finally {
      await sweep(tagged);
    }
  }
}

test.each(forkers)('$name is killed with all it forked, every time', async ({ script }) => {
  await eachForker(5, script, async (marker, tagged) => {
    await byIndex.kill(marker);
    expect(ofScript(tagged)).toEqual([]);
    // A survivor keeps forking: it would show up again.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(ofScript(tagged)).toEqual([]);
    expect(await byIndex.processes(marker)).toEqual([]);
  });
});

test.each(forkers)('$name is frozen whole: nothing runs or forks until it is thawed', async ({ script }) => {
  await eachForker(3, script, async (marker, tagged) => {
    await byIndex.freeze(marker);
    const frozen = ofScript(tagged);
    expect(frozen.length).toBeGreaterThan(0);
    for (const pid of frozen) expect(stateOf(pid)).toMatch(/^[Tt]$/);
    await new Promise((resolve) => setTimeout(resolve, 50));
    // Nothing new was forked: the same processes, all still stopped.
    expect(ofScript(tagged).sort()).toEqual([...frozen].sort());
    await byIndex.thaw(marker);
    // Thawed, nothing stays stopped, and the chain forks again, unless the kernel hung it up: a process
    // stopped in a job-control group (`set -m`) whose parent exits while it is stopped gets SIGHUP when its
    // group becomes orphaned (README, Tracking). Seen in 1 of ~20 runs under load, as its only process gone.
    await waitFor(
      'the forker to run again, or be gone',
      async () =>
        ofScript(tagged).some((pid) => !frozen.includes(pid)) ||
        frozen.every((pid) => stateOf(pid) === undefined || stateOf(pid) === 'Z'),
    );
    for (const pid of ofScript(tagged)) expect(stateOf(pid) ?? 'gone').not.toMatch(/^[Tt]$/);
    await byIndex.kill(marker);
    expect(ofScript(tagged)).toEqual([]);
  });
});

/** The state letter of /proc/<pid>/stat. */
function stateOf(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
  } catch {
    return undefined;
  }
}

test('a worker adopts what an earlier worker started, then follows it by lineage', async () => {
  // Another host id: the first look at it scans /proc once, as a restarted worker's does.
  const marker = { hostId: uniqueId('host-restarted'), sandboxId: uniqueId('sbx-adopted') };
  started.push(marker);
  const gate = path.join(dataDir, uniqueId('gate'));
  // Started outside this process's starter, as by a worker that has since died; it runs a child that
  // later drops its marker and renames itself.
  const earlier = spawn(
    '/bin/bash',
    ['-c', `bash -c 'while [ ! -e ${gate} ]; do sleep 0.05; done; exec -c -a renamed sleep ${sleeper(31)}' & wait`],
    { env: { PATH: '/usr/bin:/bin', ...markerEnv(marker) }, detached: true, stdio: 'ignore' },
  );
  earlier.unref();
  await waitFor('the earlier worker’s processes', async () => pidsMentioning(gate).length === 2);
  // Listed before the lookup, and only those still alive after it: bash forks a copy of itself (same
  // command line) for every `sleep`, so a listing taken after the lookup can name a fork born since.
  const earlierPids = pidsMentioning(gate);
  const found = (await byIndex.processes(marker)).map((p) => p.pid);
  expect(found).toEqual(expect.arrayContaining(earlierPids.filter(alive)));
  writeFileSync(gate, '');
  await waitFor('the child renamed', async () => running(31, 'renamed').length === 1);
  expect((await byIndex.processes(marker)).map((p) => p.pid)).toEqual(
    expect.arrayContaining([earlier.pid, ...running(31, 'renamed')]),
  );
  await byIndex.kill(marker);
  expect(running(31, 'renamed')).toEqual([]);
  expect(alive(earlier.pid!)).toBe(false);
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie is not alive: its parent (init) has not reaped it yet.
  return !/^\S+ \(.*\) Z/.test(readStat(pid));
}

function readStat(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return '';
  }
}

/** Processes whose command line mentions `text`. */
function pidsMentioning(text: string): number[] {
  return readdirSync('/proc')
    .filter((name) => /^[0-9]+$/.test(name))
    .filter((name) => {
      try {
        return readFileSync(`/proc/${name}/cmdline`, 'latin1').includes(text);
      } catch {
        return false;
      }
    })
    .map(Number);
}

// A session id is its leader's pid: once every process of a session has exited, the kernel hands
// that pid out again, and the new process may lead a session of its own (a neighbour's command, a
// host daemon). The sandbox that had the old session must never signal the new one. Pids wrap
// after ~32,000 forks here; the test takes the shortcut a checkpoint/restore tool uses (root:
// /proc/sys/kernel/ns_last_pid) to have the kernel hand out the pid it wants next.

/** Freezes, thaws and kills the sandbox `marker`: `pid`, not the sandbox's, is never stopped and still alive after. */
async function expectNeverSignalled(marker: SandboxMarker, pid: number): Promise<void> {
  await byIndex.freeze(marker);
  expect(stateOf(pid)).not.toMatch(/^[Tt]$/);
  await byIndex.thaw(marker);
  await byIndex.kill(marker);
  expect(alive(pid)).toBe(true);
}

/** Starts `command` as a process of the host (not through the process starter), leading a session of its own; its pid. */
async function hostProcess(command: string, args: string[]): Promise<number> {
  const child = spawn(command, args, { detached: true, stdio: 'ignore' });
  child.unref();
  await waitFor('the host process', async () => child.pid !== undefined);
  return child.pid!;
}

/** Makes `pid` the next pid the kernel hands out, if it is free. */
function nextPidIs(pid: number): void {
  writeFileSync('/proc/sys/kernel/ns_last_pid', String(pid - 1));
}

/** The pid last handed out (/proc/loadavg). */
function lastPid(): number {
  return Number(readFileSync('/proc/loadavg', 'utf8').trim().split(' ')[4]);
}

/**
 * Runs `start` (which starts one process and returns its pid) until the process it starts gets
 * pid `pid`: another process on the host may fork in between and take it. A miss is killed.
 * False when a process of the host holds `pid` meanwhile.
 */
async function startWithPid(pid: number, start: () => Promise<number>): Promise<boolean> {
  for (let attempt = 0; attempt < 50 && readStat(pid) === ''; attempt += 1) {
    nextPidIs(pid);
    const got = await start();
    if (got === pid) return true;
    signal(-got, 'SIGKILL');
  }
  return false;
}

/**
 * An ended session of a sandbox of ours, and `start` run until what it starts has that session's
 * id. Tried again with another ended session while the host takes the pid first (under load).
 */
async function reusedSession(
  start: () => Promise<number>,
): Promise<{ marker: SandboxMarker; session: number; lookedAt: number }> {
  for (let attempt = 0; attempt < 20; attempt += 1) {
    const ended = await sandboxWithEndedSession();
    if (await startWithPid(ended.session, start)) return ended;
  }
  throw new Error('could not start a process with the pid of an ended session: the host keeps taking them');
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // gone
  }
}

/** A sandbox whose one session has ended: a command that exited, looked at once since (as a worker's calls do). */
async function sandboxWithEndedSession(): Promise<{ marker: SandboxMarker; session: number; lookedAt: number }> {
  const marker = { hostId, sandboxId: uniqueId('sbx-ended') };
  const session = await startIn(marker, 'exit 0');
  // Reaped: the pid is free again.
  await waitFor('the command to exit', async () => readStat(session) === '');
  expect(await byIndex.processes(marker)).toEqual([]);
  return { marker, session, lookedAt: lastPid() };
}

test('a neighbour’s command that gets the pid of our ended session is not ours to freeze or kill', async () => {
  const neighbour = { hostId, sandboxId: uniqueId('sbx-neighbour') };
  started.push(neighbour);
  // The neighbour's command leads a new session whose id is our old one.
  const { marker: mine, session } = await reusedSession(() => startIn(neighbour, `sleep ${sleeper(41)}`));
  try {
    await waitFor('the neighbour’s command', async () => running(41).length > 0);
    expect(running(41)).toEqual([session]);
    await expectNeverSignalled(mine, session);
    expect((await byIndex.processes(neighbour)).map((p) => p.pid)).toContain(session);
  } finally {
    for (const pid of running(41)) signal(pid, 'SIGKILL');
  }
});

test('a host process that gets the pid of our ended session is never signalled, even if no fork counted it', async () => {
  try {
    // A process the host starts (not through the process starter), leading its own session.
    const { marker: mine, session, lookedAt } = await reusedSession(() => hostProcess('sleep', [sleeper(42)]));
    // Forks that fail at a process limit (a v1 pids cgroup's pids.max, the `processes` limit of a
    // sandbox on a host without cgroup v2) take a pid each but are not counted in /proc/stat: a
    // sandbox forking at its limit goes round the whole pid space in ~3 s (40,000 failed forks,
    // measured) and the pid cursor ends near where it was when the worker last looked, as here.
    writeFileSync('/proc/sys/kernel/ns_last_pid', String(lookedAt));
    await expectNeverSignalled(mine, session);
  } finally {
    for (const pid of running(42)) signal(pid, 'SIGKILL');
  }
});

test('a pid the starter reported that a host process holds by the time the worker hears of it is never the sandbox’s', async () => {
  const marker = { hostId, sandboxId: uniqueId('sbx-late') };
  started.push(marker);
  let host: number | undefined;
  try {
    for (let attempt = 0; attempt < 20 && host === undefined; attempt += 1) {
      // The command ends and the starter reaps it before the worker tracks it (a stalled worker)...
      const command = await startProcess({
        file: '/bin/true',
        args: [],
        cwd: dataDir,
        env: markerEnv(marker),
        background: false,
        maxOutputBytes: 0,
      });
      await command.exited;
      expect(command.startTime).toMatch(/^[0-9]+$/);
      // Start times count clock ticks (10 ms): a pid handed out again takes the pid space round,
      // which takes longer than that; here ns_last_pid skips the round, so the host waits a tick.
      await new Promise((resolve) => setTimeout(resolve, 25));
      // ...and a process of the host, leading a session of its own, gets its pid meanwhile.
      const got = await startWithPid(command.pid, () => hostProcess('sleep', [sleeper(71)]));
      if (!got) continue;
      host = command.pid;
      trackStarted(marker, command.pid, command.startTime);
    }
    if (host === undefined) throw new Error('could not start a host process with the pid of an ended command');
    expect(await byIndex.processes(marker)).toEqual([]);
    await expectNeverSignalled(marker, host);
  } finally {
    for (const pid of running(71)) signal(pid, 'SIGKILL');
  }
});

// A chain that clears its marker in each generation but stays in the session. (One that starts a new
// session each generation, keeping its marker, still escapes a kill now and then on a loaded machine:
// README, "Tracking", names it with the documented limit; it is not tested here for that reason.)
const leavers: { name: string; script: (tag: string) => string }[] = [
  {
    name: 'a chain that clears its marker each generation and stays in the session',
    script: (tag) => `f() { : ${tag}; (env -i /bin/bash -c "$(declare -f f); f" &); }; f`,
  },
];

test.each(leavers)('$name is killed with all it forked, every time', async ({ script }) => {
  for (let attempt = 0; attempt < 5; attempt += 1) {
    const marker = { hostId, sandboxId: uniqueId('sbx-leaver') };
    const tag = uniqueId('leaver');
    try {
      await startIn(marker, script(tag));
      await waitFor('the chain', async () => pidsMentioning(tag).length > 0);
      await byIndex.kill(marker);
      expect(pidsMentioning(tag)).toEqual([]);
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(pidsMentioning(tag)).toEqual([]);
    } finally {
      await sweepMentioning(tag);
    }
  }
});

/** Kills every process whose command line mentions `tag`, until none is left. */
async function sweepMentioning(tag: string): Promise<void> {
  for (let round = 0; round < 100 && pidsMentioning(tag).length > 0; round += 1) {
    for (const pid of pidsMentioning(tag)) signal(pid, 'SIGKILL');
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

test('a frozen sandbox is killed without a thaw; one with nothing left running freezes, thaws and is killed at once', async () => {
  const { script } = forkers[1];
  const marker = { hostId, sandboxId: uniqueId('sbx-frozen-kill') };
  const tagged = script(uniqueId('forker'));
  try {
    await startIn(marker, tagged);
    await waitFor('the forker', async () => ofScript(tagged).length > 0);
    await byIndex.freeze(marker);
    await byIndex.freeze(marker); // twice: nothing is left running, so it returns
    await byIndex.kill(marker);
    expect(ofScript(tagged)).toEqual([]);
  } finally {
    await sweep(tagged);
  }
  // Its command exited, leaving a session with no process: nothing to stop, nothing to wait for.
  const { marker: ended } = await sandboxWithEndedSession();
  await byIndex.freeze(ended);
  await byIndex.thaw(ended);
  await byIndex.kill(ended);
  expect(await byIndex.processes(ended)).toEqual([]);
});

// A process whose main thread exits while another thread runs shows as a zombie in /proc/<pid>/stat
// (the thread group leader's state) and has no environ or cmdline there, yet runs and forks on.
const LEADER_EXITS = [
  'import ctypes, os, sys, threading, time',
  'if sys.argv[2] == "group": os.setpgid(0, 0)',
  'open(sys.argv[1], "w").write(str(os.getpid()))',
  'threading.Thread(target=lambda: time.sleep(600)).start()',
  // SYS_exit, not exit_group: only the calling (main) thread exits.
  'ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)',
].join('\n');

/** The file of LEADER_EXITS (python3 <file> <pid file> group|session). */
function leaderExits(): string {
  const script = path.join(dataDir, 'leader-exits.py');
  writeFileSync(script, LEADER_EXITS);
  return script;
}

/** The states of the threads of `pid` that have not exited. */
function liveThreads(pid: number): string[] {
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  return tids
    .map((tid) => {
      try {
        const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
      } catch {
        return 'X';
      }
    })
    .filter((state) => state !== 'Z' && state !== 'X');
}

test('a process whose main thread exited while another runs (its pid shows a zombie) is frozen and killed', async () => {
  const marker = { hostId, sandboxId: uniqueId('sbx-leader-exits') };
  const script = leaderExits();
  const child = path.join(dataDir, uniqueId('pid'));
  const orphan = path.join(dataDir, uniqueId('pid'));
  // A child in a group of its own (the session's group signal misses it), and an orphan in a session
  // of its own that keeps its marker; the command waits for its child.
  await startIn(marker, `(setsid python3 ${script} ${orphan} session &); python3 ${script} ${child} group & wait`);
  const pidIn = (file: string) => Number(readFileSync(file, 'utf8'));
  await waitFor('both leaders to exit', async () =>
    [child, orphan].every((file) => {
      try {
        return /^\S+ \(.*\) Z/.test(readStat(pidIn(file))) && liveThreads(pidIn(file)).length === 1;
      } catch {
        return false;
      }
    }),
  );
  const pids = [pidIn(child), pidIn(orphan)];
  try {
    await byIndex.freeze(marker);
    for (const pid of pids) expect(liveThreads(pid)).toEqual(['T']);
    await byIndex.thaw(marker);
    await byIndex.kill(marker);
    for (const pid of pids) expect(liveThreads(pid)).toEqual([]);
  } finally {
    for (const pid of pids) signal(pid, 'SIGKILL');
  }
});

test('an orphan that stays in the session of a live command is killed after the sandbox forked round the pid space', async () => {
  const marker = { hostId, sandboxId: uniqueId('sbx-round') };
  const gate = path.join(dataDir, uniqueId('gate'));
  // The command forks an orphan that clears its marker and stays in the session, then clears its own.
  const session = await startIn(
    marker,
    `while [ ! -e ${gate} ]; do sleep 0.05; done; (env -i X=1 sleep ${sleeper(81)} &); exec env -i sleep ${sleeper(82)}`,
  );
  const pidMax = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8'));
  const ahead = Math.min(session + 10_000, pidMax - 50);
  expect(ahead).toBeGreaterThan(session + 100);
  // Looked at (the session confirmed) 10,000 pids later, before the orphan exists.
  writeFileSync('/proc/sys/kernel/ns_last_pid', String(ahead));
  expect((await byIndex.processes(marker)).map((p) => p.pid)).toContain(session);
  writeFileSync(gate, '');
  await waitFor('the orphan and the command', async () => running(81).length === 1 && running(82).length === 1);
  // Forks round the pid space since (the test's shortcut: the kernel's cursor set back to the session's id)
  // before the worker looks again: the id may name another session by now, by the count alone.
  writeFileSync('/proc/sys/kernel/ns_last_pid', String(session));
  await byIndex.kill(marker);
  expect(running(82)).toEqual([]);
  expect(running(81)).toEqual([]);
});

test('a host process whose main thread exited, that gets the pid of our ended session, is never signalled', async () => {
  const script = leaderExits();
  let session: number | undefined;
  try {
    // Started by the host, leading its own session, as in the test above; its main thread exits.
    const ended = await reusedSession(() =>
      hostProcess('python3', [script, path.join(dataDir, uniqueId('pid')), 'session']),
    );
    session = ended.session;
    await waitFor(
      'its main thread to exit',
      async () => /^\S+ \(.*\) Z/.test(readStat(session!)) && liveThreads(session!).length === 1,
    );
    // No fork counted since the sandbox's last look (see the test above).
    writeFileSync('/proc/sys/kernel/ns_last_pid', String(ended.lookedAt));
    await byIndex.freeze(ended.marker);
    expect(liveThreads(session)).toEqual(['S']);
    await byIndex.thaw(ended.marker);
    await byIndex.kill(ended.marker);
    expect(liveThreads(session)).toEqual(['S']);
  } finally {
    if (session !== undefined) signal(session, 'SIGKILL');
  }
});
