import { spawn } from 'node:child_process';
import { once } from 'node:events';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createBwrapProvider } from '../../providers/bwrap';
import { sandboxPaths } from '../../providers/sandbox-state';
import { context, stasisError, tempDir, uniqueId, waitFor } from './helpers';
import { makeHost, readCounter, sh } from './harness';

// The bwrap provider: the same lifecycle as local, with each command isolated
// by bubblewrap. Needs the `bubblewrap` package on the test machine.

const bwrapHost = () => makeHost({ make: (deps) => createBwrapProvider(deps) });

describe('bwrap provider', () => {
  it('advertises the same capabilities as local', async () => {
    const host = await bwrapHost();
    expect(host.provider.name).toBe('bwrap');
    expect(host.provider.capabilities).toEqual({
      pauseModes: ['DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'],
      pause: true,
      crossHostRestore: true,
    });
  });

  it('runs each command in its own pid namespace, without network, on a read-only system', async () => {
    const host = await bwrapHost();
    const id = await host.sandbox();
    expect(await sh(host.provider, id, 'pwd; echo $HOME')).toBe('/workspace\n/home/sandbox\n');
    const pids = (await sh(host.provider, id, 'ls /proc | grep -E "^[0-9]+$"')).trim().split('\n');
    expect(pids.length).toBeLessThanOrEqual(5);
    expect(pids).toContain('1');
    const interfaces = (await sh(host.provider, id, 'tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " "'))
      .trim()
      .split('\n');
    expect(interfaces).toEqual(['lo']);
    const readOnly = await host.provider.exec(
      { sandboxId: id, fence: 1, jobId: 'j', command: 'touch /usr/stasis-probe' },
      context(),
    );
    expect(readOnly.exitCode).not.toBe(0);
    expect(readOnly.stderr).toContain('Read-only file system');
    await expect(fs.access('/usr/stasis-probe')).rejects.toThrow();
  });

  it('reads none of the host’s private files, though it runs as the worker’s user (root here)', async () => {
    const host = await bwrapHost();
    const id = await host.sandbox();
    // Sizes as the host sees them: both hold something only root may read.
    expect((await fs.stat('/etc/shadow')).size).toBeGreaterThan(0);
    const probe = await host.provider.exec(
      {
        sandboxId: id,
        fence: 1,
        jobId: 'j',
        command: 'cat /etc/shadow; ls -A /etc/ssl/private | wc -l; grep -c "^root:" /etc/passwd',
      },
      context(),
    );
    // The secrets are covered (a device node on a nodev mount: not even openable); the rest of /etc is there.
    expect(probe.stdout).toBe('0\n1\n');
    expect(probe.stderr).toMatch(/\/etc\/shadow: Permission denied/);
  });

  it('cannot change the host kernel through its /proc (sysctls, sysrq)', async () => {
    const host = await bwrapHost();
    const id = await host.sandbox();
    const before = await fs.readFile('/proc/sys/kernel/printk_ratelimit', 'utf8');
    const probe = await host.provider.exec(
      {
        sandboxId: id,
        fence: 1,
        jobId: 'j',
        // Writes the value it has (harmless if it got through); sysrq 'h' only prints help.
        command: `echo ${before.trim()} > /proc/sys/kernel/printk_ratelimit && echo SYSCTL-WRITTEN; [ -e /proc/sysrq-trigger ] && echo h > /proc/sysrq-trigger && echo SYSRQ-WRITTEN; echo end`,
      },
      context(),
    );
    expect(probe.stdout).toBe('end\n');
    expect(probe.stderr).toMatch(/printk_ratelimit: Read-only file system/);
  });

  it('binds only its own directories: another sandbox and the data dir are not visible', async () => {
    const host = await bwrapHost();
    const mine = await host.sandbox();
    const other = await host.sandbox();
    await host.provider.writeFile(
      { sandboxId: other, path: 'secret.txt', content: Buffer.from('other tenant') },
      context(),
    );
    const otherWorkspace = sandboxPaths(host.dataDir, other).workspace;
    const probe = await host.provider.exec(
      {
        sandboxId: mine,
        fence: 1,
        jobId: 'j',
        command: `cat ${otherWorkspace}/secret.txt; ls ${host.dataDir}; ls /envs /home/sandbox >/dev/null && echo own-dirs-ok`,
      },
      context(),
    );
    expect(probe.stdout).toBe('own-dirs-ok\n');
    expect(probe.stderr).toContain('No such file or directory');
    expect(probe.stderr).not.toContain('other tenant');

    await sh(host.provider, mine, 'echo from-inside > /workspace/out.txt; echo rc > /home/sandbox/.rc');
    expect((await host.provider.readFile({ sandboxId: mine, path: 'out.txt' }, context())).toString()).toBe(
      'from-inside\n',
    );
    expect(await fs.readFile(path.join(sandboxPaths(host.dataDir, mine).home, '.rc'), 'utf8')).toBe('rc\n');
  });

  it('binds an active workspace host path at /workspace', async () => {
    const host = await bwrapHost();
    const hostPath = path.join(await tempDir('active'), 'project');
    const id = await host.sandbox({ hostPath });
    await sh(host.provider, id, 'echo persisted > /workspace/notes.txt');
    expect(await fs.readFile(path.join(hostPath, 'notes.txt'), 'utf8')).toBe('persisted\n');
  });

  it('pauses, resumes, snapshots and restores like local, killing every bubblewrap process', async () => {
    const host = await bwrapHost();
    const id = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, id).workspace;
    // A background loop does not outlive its command's pid namespace, so it runs in the foreground of a long exec.
    // It replaces the counter by rename: frozen between `>`'s truncate and its write, the snapshot holds
    // an empty counter (as it should: the disk's state), which the read after the restore cannot tell apart.
    const running = host.provider.exec(
      {
        sandboxId: id,
        fence: 1,
        jobId: 'loop',
        command: 'i=0; while true; do i=$((i+1)); echo $i > counter.new; mv counter.new counter; sleep 0.02; done',
      },
      context(),
    );
    await waitFor('the counter to run', async () => (await readCounter(workspace)) > 3);
    expect(await host.provider.processCount(id)).toBeGreaterThanOrEqual(3); // bwrap + init, bwrap + loop
    await host.provider.pause({ sandboxId: id, fence: 1 }, context());
    const frozen = await readCounter(workspace);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await readCounter(workspace)).toBe(frozen);
    await host.provider.resume({ sandboxId: id, fence: 1 }, context());
    await waitFor('the counter to advance', async () => (await readCounter(workspace)) > frozen + 3);

    const receipt = await host.provider.release(
      { sandboxId: id, idempotencyKey: 'k', mode: 'SNAPSHOT_AND_TERMINATE', fence: 2, reason: 'test' },
      context(),
    );
    expect(await host.provider.processCount(id)).toBe(0);
    const outcome = await running;
    expect(outcome.exitCode).toBe(137);
    expect(outcome.stderr).toContain("the sandbox's compute was released while the command ran");
    if (!receipt.checkpoint) throw new Error('no checkpoint');
    expect(await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: receipt.checkpoint }, context())).toEqual(
      {
        source: 'local-copy',
        labels: {},
      },
    );
    expect(Number(await sh(host.provider, id, 'cat counter', 3))).toBeGreaterThan(frozen);
    await stasisError(
      host.provider.exec({ sandboxId: id, fence: 2, jobId: 'late', command: 'true' }, context()),
      'STALE_FENCE',
    );
  });

  it('launches bubblewrap by its absolute path with a fixed environment, whatever PATH the sandbox sets', async () => {
    const host = await bwrapHost();
    const outside = await tempDir('outside');
    const id = await host.sandbox({ env: { PATH: './bin:/usr/bin:/bin' } });
    // A fake bwrap in the workspace: run on the host (cwd = the workspace), it would write outside.
    await host.provider.writeFile(
      { sandboxId: id, path: 'bin/bwrap', content: Buffer.from(`#!/bin/sh\necho escaped > ${outside}/pwned\n`) },
      context(),
    );
    await sh(host.provider, id, 'chmod +x bin/bwrap');
    const outcome = await host.provider.exec(
      {
        sandboxId: id,
        fence: 1,
        jobId: 'path',
        command: 'echo "$PATH|$MINE"; cat /proc/1/environ | tr "\\0" "\\n"',
        env: { PATH: './bin:/usr/bin:/bin', MINE: 'm' },
      },
      context(),
    );
    expect(await fs.readdir(outside)).toEqual([]);
    expect(outcome.exitCode).toBe(0);
    // The sandbox still gets its own environment, inside.
    expect(outcome.stdout.split('\n')[0]).toBe('./bin:/usr/bin:/bin|m');
  });

  it('sandboxes outlive a SIGKILLed worker and are adopted by the next one: running job, retained compute, files', async () => {
    const host = await bwrapHost(); // for its host id and data dir; its processes are cleaned up after the file
    const [retained, running] = [uniqueId('retained'), uniqueId('running')];
    const worker = spawn(
      process.execPath,
      [
        '-r',
        path.join(__dirname, '..', '..', 'scripts', 'register-ts.js'),
        path.join(__dirname, 'bwrap-worker.ts'),
        host.dataDir,
        host.hostId,
        retained,
        running,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve, reject) => {
      worker.stdout.on('data', (chunk: Buffer) => chunk.toString().includes('READY') && resolve());
      worker.once('exit', (code) => reject(new Error(`the worker exited (${code}) before it was ready`)));
    });
    const workspace = sandboxPaths(host.dataDir, running).workspace;
    await waitFor('the counter to run', async () => (await readCounter(workspace)) > 3);
    const before = {
      retained: await host.provider.processCount(retained),
      running: await host.provider.processCount(running),
    };
    worker.kill('SIGKILL');
    await once(worker, 'exit');
    await new Promise((resolve) => setTimeout(resolve, 500)); // long enough for the starter to go and take children with it
    // The retained sandbox keeps exactly its processes; the running one's loop forks a sleep now and then.
    expect(await host.provider.processCount(retained)).toBe(before.retained);
    expect(await host.provider.processCount(running)).toBeGreaterThanOrEqual(3);
    const counted = await readCounter(workspace);
    await waitFor('the job to keep counting', async () => (await readCounter(workspace)) > counted + 3);

    // The next worker adopts them: start finds the compute alive, exec runs in it, files and state are intact.
    const next = host.restart();
    const listed = (await next.listSandboxes()).filter((s) => s.sandboxId === retained || s.sandboxId === running);
    expect(listed.sort((a, b) => a.sandboxId.localeCompare(b.sandboxId))).toEqual(
      [retained, running].sort().map((sandboxId) => ({ sandboxId, alive: true, dormant: false })),
    );
    const retainedPids = await next.processCount(retained);
    for (const sandboxId of [retained, running]) {
      await next.start({ sandboxId, fence: 2 }, context()); // nothing new is started: the compute is there
      expect(await sh(next, sandboxId, 'cat kept.txt; echo; pwd', 2)).toBe(`${sandboxId}\n/workspace\n`);
    }
    expect(await next.processCount(retained)).toBe(retainedPids);
    // The job the dead worker started is not run again; its process is still the one counting.
    await stasisError(
      next.exec(
        {
          sandboxId: running,
          fence: 2,
          jobId: 'counter',
          command: 'i=0; while true; do i=$((i+1)); echo $i > counter; sleep 0.02; done',
        },
        context(),
      ),
      'JOB_INTERRUPTED',
    );
    await next.release(
      { sandboxId: running, idempotencyKey: 'stop', mode: 'TERMINATE', fence: 3, reason: 'test' },
      context(),
    );
    expect(await next.processCount(running)).toBe(0);
  });
});
