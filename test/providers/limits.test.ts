import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxProvider } from '../../providers/api';
import { createBwrapProvider } from '../../providers/bwrap';
import { sandboxPaths } from '../../providers/sandbox-state';
import type { SandboxLimits } from '../../common/schemas';
import { context, uniqueId, waitFor } from './helpers';
import { makeHost, readCounter, sh, type Host } from './harness';

// Hostile sandboxes against their host and neighbours, for both providers: a process
// that hides from or forges the sandbox's marker, a fork bomb, a memory hog and a disk
// filler. Each is bounded, so that run against a host without the defences it fails
// the assertions without taking the machine down.

const providers: [string, () => Promise<Host>][] = [
  ['local', () => makeHost()],
  ['bwrap', () => makeHost({ make: (deps) => createBwrapProvider(deps) })],
];

async function limited(host: Host, limits: SandboxLimits): Promise<string> {
  const sandboxId = uniqueId('lim');
  await host.provider.provision({ sandboxId, fence: 1, limits }, context());
  await host.provider.start({ sandboxId, fence: 1 }, context());
  return sandboxId;
}

const exec = (provider: SandboxProvider, sandboxId: string, command: string, timeoutMs = 60_000) =>
  provider.exec({ sandboxId, fence: 1, jobId: uniqueId('job'), command, timeoutMs }, context());

/**
 * The sandbox's process count once it holds still (three reads 100 ms apart agree): just after an exec,
 * the exec's own processes may still be exiting (a clean-clone run counted 4, then 3).
 */
async function steadyCount(provider: SandboxProvider, sandboxId: string): Promise<number> {
  const reads = [await provider.processCount(sandboxId)];
  while (reads.length < 3 || new Set(reads.slice(-3)).size > 1) {
    await sleep(100);
    reads.push(await provider.processCount(sandboxId));
  }
  return reads[reads.length - 1];
}

/** A loop detached from its exec (a daemon), counting into `file` in the workspace, with `env` before it. */
const daemon = (file: string, env: string) =>
  `${env} setsid nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > ${file}; sleep 0.02; done' >/dev/null 2>&1 &`;

describe.each(providers)('%s provider', (_name, makeProviderHost) => {
  it('a process that unsets its marker is still frozen and killed with its sandbox', async () => {
    const host = await makeProviderHost();
    const id = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, id).workspace;
    // Under bwrap a daemon dies with its exec's pid namespace, so the loop runs in a long exec there.
    const running = exec(
      host.provider,
      id,
      `${daemon('hidden', 'env -u STASIS_SANDBOX_ID -u STASIS_SANDBOX_HOST')}\nsleep 600`,
    );
    running.catch(() => undefined);
    await waitFor('the hidden loop to count', async () => (await readCounter(workspace, 'hidden')) > 3);
    await host.provider.pause({ sandboxId: id, fence: 1 }, context());
    const frozen = await readCounter(workspace, 'hidden');
    await sleep(300);
    expect(await readCounter(workspace, 'hidden')).toBe(frozen);
    await host.provider.release(
      { sandboxId: id, idempotencyKey: 'k', mode: 'TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    const killed = await readCounter(workspace, 'hidden');
    await sleep(300);
    expect(await readCounter(workspace, 'hidden')).toBe(killed);
    expect(await host.provider.processCount(id)).toBe(0);
  });

  it('a process that takes another sandbox’s marker is neither counted, frozen nor killed as that sandbox’s', async () => {
    const host = await makeProviderHost();
    const victim = await host.sandbox();
    const attacker = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, attacker).workspace;
    await sh(host.provider, victim, 'true'); // its compute is all up (bwrap forks its inner init after the start)
    const victimCount = await steadyCount(host.provider, victim);
    const running = exec(
      host.provider,
      attacker,
      `${daemon('forged', `env STASIS_SANDBOX_ID=${victim} STASIS_SANDBOX_HOST=${host.hostId}`)}\nsleep 600`,
    );
    running.catch(() => undefined);
    await waitFor('the forged loop to count', async () => (await readCounter(workspace, 'forged')) > 3);
    expect(await host.provider.processCount(victim)).toBe(victimCount);
    // Freezing and killing the victim leaves the attacker's process alone (it is the attacker's to lose).
    await host.provider.pause({ sandboxId: victim, fence: 1 }, context());
    await host.provider.release(
      { sandboxId: victim, idempotencyKey: 'k', mode: 'TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    const counted = await readCounter(workspace, 'forged');
    await waitFor(
      'the attacker’s loop to keep counting',
      async () => (await readCounter(workspace, 'forged')) > counted + 3,
    );
    expect(await host.provider.processCount(victim)).toBe(0);
  });

  it('a fork bomb stops at the process limit; the worker and a neighbour keep working', async () => {
    const host = await makeProviderHost();
    const bomb = await limited(host, { processes: 64 });
    const neighbour = await host.sandbox();
    // Bounded: 400 sleepers, far past the limit, each gone after a minute at the latest.
    const outcome = exec(
      host.provider,
      bomb,
      'for i in $(seq 400); do sleep 60 & done; echo started; sleep 600',
      120_000,
    );
    outcome.catch(() => undefined);
    await waitFor('the bomb to fill its sandbox', async () => (await host.provider.processCount(bomb)) >= 50);
    const counts: number[] = [];
    for (let i = 0; i < 10; i += 1) {
      counts.push(await host.provider.processCount(bomb));
      await sleep(100);
    }
    expect(Math.max(...counts)).toBeLessThanOrEqual(64);
    expect(await sh(host.provider, neighbour, 'echo alive')).toBe('alive\n');
    await host.provider.release(
      { sandboxId: bomb, idempotencyKey: 'k', mode: 'TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    expect(await host.provider.processCount(bomb)).toBe(0);
  });

  it('a memory hog fails at the memory limit; a neighbour keeps working', async () => {
    const host = await makeProviderHost();
    const hog = await limited(host, { memoryMiB: 64 });
    const neighbour = await host.sandbox();
    // The shell keeps a command's whole output in memory: 128 MiB of it.
    const hogging = 'x=$(head -c SIZE /dev/zero | tr "\\0" a); echo ${#x}';
    const outcome = await exec(host.provider, hog, hogging.replace('SIZE', '128M'));
    expect(outcome.exitCode).not.toBe(0);
    expect(outcome.stdout).not.toBe(`${128 * 1024 * 1024}\n`);
    expect(await sh(host.provider, neighbour, hogging.replace('SIZE', '16M'))).toBe(`${16 * 1024 * 1024}\n`);
  });

  it('a file cannot grow past the file size limit', async () => {
    const host = await makeProviderHost();
    const filler = await limited(host, { fileMiB: 8 });
    const outcome = await exec(host.provider, filler, 'head -c 64M /dev/zero > big; echo $?; stat -c %s big');
    const size = Number(outcome.stdout.trim().split('\n').pop());
    expect(size).toBeLessThanOrEqual(8 * 1024 * 1024);
    expect(outcome.stdout.split('\n')[0]).not.toBe('0');
  });

  it('limits outside the allowed ranges are refused at provision', async () => {
    const host = await makeProviderHost();
    await expect(
      host.provider.provision({ sandboxId: uniqueId('lim'), fence: 1, limits: { processes: 0 } }, context()),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('limits.processes') });
  });
});
