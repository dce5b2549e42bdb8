import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createLocalProvider } from '../../providers/local';
import { sandboxPaths } from '../../providers/sandbox-state';
import type { CheckpointStore } from '../../stores/api';
import { passThrough } from '../helpers/store-wrap';
import { context, listTree, stasisError, tempDir, waitFor } from './helpers';
import { makeHost, readCounter, sh, startCounter } from './harness';

// The local provider with real processes and files.

const release = (
  sandboxId: string,
  mode: 'DETACH' | 'TERMINATE' | 'SNAPSHOT_AND_TERMINATE',
  fence: number,
  key = `${sandboxId}/${fence}/release`,
) => ({
  sandboxId,
  idempotencyKey: key,
  mode,
  fence,
  reason: 'test',
});

describe('local provider: commands', () => {
  it('runs a command in the workspace with the sandbox env and marker, never the worker env', async () => {
    const host = await makeHost();
    const id = await host.sandbox({ env: { GREETING: 'hello' } });
    const paths = sandboxPaths(host.dataDir, id);
    process.env.STASIS_TEST_WORKER_SECRET = 'do-not-leak';
    const outcome = await host.provider.exec(
      {
        sandboxId: id,
        fence: 1,
        jobId: 'j1',
        command:
          'pwd; echo "$HOME|$GREETING|$EXTRA|$STASIS_SANDBOX_ID|$STASIS_TEST_WORKER_SECRET"; echo err >&2; exit 3',
        env: { EXTRA: 'x' },
      },
      context(),
    );
    expect(outcome).toEqual({
      exitCode: 3,
      stdout: `${paths.workspace}\n${paths.home}|hello|x|${id}|\n`,
      stderr: 'err\n',
    });
    expect(await host.provider.processCount(id)).toBe(1); // the init process
  });

  it('kills the whole process group on timeout, and on cancellation', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const timedOut = await host.provider.exec(
      { sandboxId: id, fence: 1, jobId: 'j', command: 'sleep 30 & sleep 30', timeoutMs: 300 },
      context(),
    );
    expect(timedOut.exitCode).toBe(124);
    expect(timedOut.stderr).toContain('timed out after 300 ms');
    await waitFor('the timed-out group to die', async () => (await host.provider.processCount(id)) === 1);

    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('activity cancelled')), 200);
    await expect(
      host.provider.exec(
        { sandboxId: id, fence: 1, jobId: 'k', command: 'sleep 30 & sleep 30' },
        context({ signal: controller.signal }),
      ),
    ).rejects.toThrow('activity cancelled');
    await waitFor('the cancelled group to die', async () => (await host.provider.processCount(id)) === 1);
  });

  it('caps captured output and says so', async () => {
    const host = await makeHost({ maxOutputBytes: 1000 });
    const id = await host.sandbox();
    const out = await sh(host.provider, id, "head -c 5000 /dev/zero | tr '\\0' a");
    expect(out.startsWith('a'.repeat(1000))).toBe(true);
    expect(out).toContain('[stasis: output truncated after 1000 bytes, 4000 more dropped]');
  });

  it('reads and writes workspace files and refuses paths that escape it', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const outside = await tempDir('outside');
    await fs.writeFile(path.join(outside, 'secret'), 'host secret');
    await host.provider.writeFile({ sandboxId: id, path: 'dir/new.txt', content: Buffer.from('content') }, context());
    expect(await sh(host.provider, id, 'cat dir/new.txt')).toBe('content');
    await sh(host.provider, id, `ln -s ${outside} out; ln -s dir inner; ln -s ${outside}/secret leak`);
    expect(
      (await host.provider.readFile({ sandboxId: id, path: '/workspace/dir/new.txt' }, context())).toString(),
    ).toBe('content');
    // No link is followed, also one that stays inside: the sandbox may turn it into one that leaves at any moment.
    for (const bad of [
      '../meta/state.json',
      '/etc/passwd',
      'out/secret',
      'leak',
      'dir/../../home/x',
      'inner/new.txt',
    ]) {
      const err = await stasisError(
        host.provider.readFile({ sandboxId: id, path: bad }, context()),
        'INVALID_ARGUMENT',
      );
      expect(err.message).toContain(bad);
    }
    await stasisError(
      host.provider.writeFile({ sandboxId: id, path: 'out/planted', content: Buffer.from('x') }, context()),
      'INVALID_ARGUMENT',
    );
    await stasisError(
      host.provider.writeFile({ sandboxId: id, path: 'leak', content: Buffer.from('x') }, context()),
      'INVALID_ARGUMENT',
    );
    expect(await fs.readdir(outside)).toEqual(['secret']);
    expect(await fs.readFile(path.join(outside, 'secret'), 'utf8')).toBe('host secret');
    await stasisError(host.provider.readFile({ sandboxId: id, path: 'missing' }, context()), 'NOT_FOUND');
  });

  it('answers NOT_FOUND for an unknown sandbox and INVALID_ARGUMENT for a bad request', async () => {
    const host = await makeHost();
    await stasisError(host.provider.start({ sandboxId: 'nope', fence: 1 }, context()), 'NOT_FOUND');
    await stasisError(host.provider.release(release('nope', 'TERMINATE', 1), context()), 'NOT_FOUND');
    const err = await stasisError(
      host.provider.release({ ...release('x', 'TERMINATE', 1), fence: -1 }, context()),
      'INVALID_ARGUMENT',
    );
    expect(err.message).toContain('fence');
    await stasisError(host.provider.provision({ sandboxId: '../escape', fence: 1 }, context()), 'INVALID_ARGUMENT');
  });
});

describe('local provider: lifecycle', () => {
  it('pause freezes every process and resume thaws them', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, id).workspace;
    await startCounter(host.provider, id);
    await waitFor('the counter to run', async () => (await readCounter(workspace)) > 3);
    await host.provider.pause({ sandboxId: id, fence: 1 }, context());
    const frozen = await readCounter(workspace);
    await sleep(300);
    expect(await readCounter(workspace)).toBe(frozen);
    await stasisError(
      host.provider.exec({ sandboxId: id, fence: 1, jobId: 'j', command: 'true' }, context()),
      'INVALID_STATE_TRANSITION',
    );
    await host.provider.resume({ sandboxId: id, fence: 1 }, context());
    await waitFor('the counter to advance again', async () => (await readCounter(workspace)) > frozen + 3);
  });

  it('stop kills all processes and keeps the files; start brings compute back', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    await sh(host.provider, id, 'echo kept > file; setsid sleep 1000 >/dev/null 2>&1 &');
    expect(await host.provider.processCount(id)).toBe(2);
    await host.provider.stop({ sandboxId: id, fence: 1 }, context());
    expect(await host.provider.processCount(id)).toBe(0);
    await stasisError(
      host.provider.exec({ sandboxId: id, fence: 1, jobId: 'j', command: 'true' }, context()),
      'INVALID_STATE_TRANSITION',
    );
    await host.provider.start({ sandboxId: id, fence: 1 }, context());
    expect(await sh(host.provider, id, 'cat file')).toBe('kept\n');
  });

  it('destroy kills everything and removes the sandbox, but never an active workspace host path', async () => {
    const host = await makeHost();
    const hostPath = path.join(await tempDir('active'), 'project');
    const id = await host.sandbox({ hostPath });
    await sh(host.provider, id, 'echo persistent > notes.txt; sleep 1000 >/dev/null 2>&1 &');
    expect(await fs.readFile(path.join(hostPath, 'notes.txt'), 'utf8')).toBe('persistent\n');
    await host.provider.destroy({ sandboxId: id, fence: 1 }, context());
    expect(await host.provider.processCount(id)).toBe(0);
    await expect(fs.access(sandboxPaths(host.dataDir, id).root)).rejects.toThrow();
    expect(await fs.readFile(path.join(hostPath, 'notes.txt'), 'utf8')).toBe('persistent\n');
    await host.provider.destroy({ sandboxId: id, fence: 1 }, context()); // idempotent
    await stasisError(
      host.provider.exec({ sandboxId: id, fence: 1, jobId: 'j', command: 'true' }, context()),
      'NOT_FOUND',
    );
  });

  it('destroy deletes every checkpoint of the sandbox, also on a host that holds no copy of it', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const first = await host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 2), context());
    await host.provider.restore({ sandboxId: id, fence: 3, checkpoint: first.checkpoint! }, context());
    await sh(host.provider, id, 'echo changed > file', 3);
    const second = await host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 4), context());
    expect(await host.store.exists(first.checkpoint!.uri)).toBe(true);
    expect(await host.store.exists(second.checkpoint!.uri)).toBe(true);
    // Another host never had the sandbox: destroy there still removes what the store holds.
    const other = await makeHost({ store: host.store });
    await other.provider.destroy({ sandboxId: id, fence: 5 }, context());
    expect(await host.store.exists(first.checkpoint!.uri)).toBe(false);
    expect(await host.store.exists(second.checkpoint!.uri)).toBe(false);
    await host.provider.destroy({ sandboxId: id, fence: 5 }, context());
    await expect(fs.access(sandboxPaths(host.dataDir, id).root)).rejects.toThrow();
  });

  it('lists its sandboxes for reconcile, also from a restarted worker', async () => {
    const host = await makeHost();
    const running = await host.sandbox();
    const stopped = await host.sandbox();
    await host.provider.stop({ sandboxId: stopped, fence: 1 }, context());
    const restarted = host.restart();
    const listed = await restarted.listSandboxes();
    expect(listed.sort((a, b) => a.sandboxId.localeCompare(b.sandboxId))).toEqual(
      [
        { sandboxId: running, alive: true, dormant: false },
        { sandboxId: stopped, alive: false, dormant: false },
      ].sort((a, b) => a.sandboxId.localeCompare(b.sandboxId)),
    );
  });
});

describe('local provider: exec jobs are never run twice', () => {
  const job = (sandboxId: string, jobId: string, command: string) => ({ sandboxId, fence: 1, jobId, command });

  it('a retried job returns the first outcome without running again, also after a worker restart', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const request = job(id, 'job-1', 'echo ran >> runs.txt; wc -l < runs.txt');
    const first = await host.provider.exec(request, context());
    expect(first).toEqual({ exitCode: 0, stdout: '1\n', stderr: '' });
    expect(await host.provider.exec(request, context())).toEqual(first);
    expect(await host.restart().exec(request, context())).toEqual(first);
    expect(await sh(host.provider, id, 'wc -l < runs.txt')).toBe('1\n');
  });

  it('a retry that arrives while the job runs waits for that same run', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const request = job(id, 'job-1', 'sleep 0.5; echo ran >> runs.txt; wc -l < runs.txt');
    const [a, b] = await Promise.all([host.provider.exec(request, context()), host.provider.exec(request, context())]);
    expect(a).toEqual({ exitCode: 0, stdout: '1\n', stderr: '' });
    expect(b).toEqual(a);
  });

  it('refuses a job an earlier worker started and did not finish, and a job id reused for another command', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const request = job(id, 'job-1', 'sleep 1; echo ran >> runs.txt');
    const running = host.provider.exec(request, context());
    await waitFor('the job to start', async () => (await host.provider.processCount(id)) > 1);
    // A restarted worker does not know how far the job got: it does not run it again.
    const err = await stasisError(host.restart().exec(request, context()), 'JOB_INTERRUPTED');
    expect(err.message).toBe(
      `sandbox ${id}: job job-1 was started by an earlier attempt that stopped with its worker; it is not run again`,
    );
    await expect(running).resolves.toMatchObject({ exitCode: 0 });
    const conflict = await stasisError(
      host.provider.exec(job(id, 'job-1', 'echo other'), context()),
      'IDEMPOTENCY_CONFLICT',
    );
    expect(conflict.message).toContain('job-1');
    expect(await sh(host.provider, id, 'cat runs.txt')).toBe('ran\n');
  });
});

describe('local provider: fences', () => {
  it('refuses a call below the highest fence seen and raises it on a higher one', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    await host.provider.attach({ sandboxId: id, fence: 5 }, context());
    const err = await stasisError(
      host.provider.exec({ sandboxId: id, fence: 4, jobId: 'j', command: 'true' }, context()),
      'STALE_FENCE',
    );
    expect(err.message).toBe(`sandbox ${id}: exec carries fence 4, but fence 5 has already been seen`);
    await stasisError(host.provider.release(release(id, 'TERMINATE', 3), context()), 'STALE_FENCE');
    expect(await host.provider.processCount(id)).toBe(1); // the stale release did nothing
    await sh(host.provider, id, 'true', 5);
    await host.provider.pause({ sandboxId: id, fence: 6 }, context());
    // The raised fence is on disk: a restarted worker refuses fence 5 too.
    await stasisError(host.restart().resume({ sandboxId: id, fence: 5 }, context()), 'STALE_FENCE');
    await host.provider.resume({ sandboxId: id, fence: 6 }, context());
  });

  it('rewrites the state only when a call changed it: a raised fence always reaches the disk', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const { stateFile } = sandboxPaths(host.dataDir, id);
    // Each write is a new file renamed over the old one: its inode tells whether the state was rewritten.
    const inode = async () => (await fs.stat(stateFile)).ino;
    const onDisk = async () => JSON.parse(await fs.readFile(stateFile, 'utf8')) as { maxFence: number; status: string };
    let last = await inode();
    // At the fence already seen, nothing changes: no write.
    await sh(host.provider, id, 'true', 1);
    await host.provider.attach({ sandboxId: id, fence: 1 }, context());
    await host.provider.release(release(id, 'DETACH', 1), context());
    expect(await inode()).toBe(last);
    // A DETACH release and an attach that raise the fence are written, and a restarted worker holds to them.
    for (const [call, fence] of [
      ['release', 2],
      ['attach', 3],
      ['exec', 4],
    ] as const) {
      if (call === 'release') await host.provider.release(release(id, 'DETACH', fence), context());
      if (call === 'attach') await host.provider.attach({ sandboxId: id, fence }, context());
      if (call === 'exec') await sh(host.provider, id, 'true', fence);
      expect(await inode()).not.toBe(last);
      last = await inode();
      expect((await onDisk()).maxFence).toBe(fence);
      await stasisError(host.restart().attach({ sandboxId: id, fence: fence - 1 }, context()), 'STALE_FENCE');
    }
    // A status change at the same fence is written too.
    await host.provider.stop({ sandboxId: id, fence: 4 }, context());
    expect((await onDisk()).status).toBe('stopped');
  });
});

describe('local provider: release', () => {
  it('is idempotent per key, also after a worker restart, and refuses a key reused for another request', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const first = await host.provider.release(release(id, 'TERMINATE', 2, 'run-1/key'), context());
    expect(first).toMatchObject({
      sandboxId: id,
      idempotencyKey: 'run-1/key',
      mode: 'TERMINATE',
      computeReleased: true,
      duplicate: false,
      fence: 2,
    });
    const again = await host.provider.release(release(id, 'TERMINATE', 2, 'run-1/key'), context());
    expect(again).toEqual({ ...first, duplicate: true });
    const afterRestart = await host
      .restart()
      .release({ ...release(id, 'TERMINATE', 2, 'run-1/key'), reason: 'retried' }, context());
    expect(afterRestart).toEqual({ ...first, duplicate: true });
    const conflict = await stasisError(
      host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 2, 'run-1/key'), context()),
      'IDEMPOTENCY_CONFLICT',
    );
    expect(conflict.message).toContain('run-1/key');
    await stasisError(
      host.provider.release(release(id, 'TERMINATE', 3, 'run-1/key'), context()),
      'IDEMPOTENCY_CONFLICT',
    );
  });

  it('DETACH leaves the processes running and reports computeReleased false', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    await startCounter(host.provider, id);
    const receipt = await host.provider.release(release(id, 'DETACH', 2), context());
    expect(receipt).toMatchObject({ mode: 'DETACH', computeReleased: false, duplicate: false });
    expect(receipt.checkpoint).toBeUndefined();
    expect(await host.provider.processCount(id)).toBeGreaterThanOrEqual(2);
    await host.provider.attach({ sandboxId: id, fence: 3 }, context());
    expect(await sh(host.provider, id, 'echo still here', 3)).toBe('still here\n');
  });

  it('TERMINATE kills every process, daemons included, keeps the workspace, and restore restarts compute on it', async () => {
    const host = await makeHost();
    const hostPath = path.join(await tempDir('active'), 'ws');
    const id = await host.sandbox({ hostPath });
    await startCounter(host.provider, id);
    await sh(host.provider, id, 'echo data > file; setsid nohup sleep 1000 >/dev/null 2>&1 &');
    const receipt = await host.provider.release(release(id, 'TERMINATE', 2), context());
    expect(receipt).toMatchObject({ computeReleased: true, duplicate: false });
    expect(receipt.checkpoint).toBeUndefined();
    expect(await host.provider.processCount(id)).toBe(0);
    expect(await fs.readFile(path.join(hostPath, 'file'), 'utf8')).toBe('data\n');
    await stasisError(
      host.provider.exec({ sandboxId: id, fence: 2, jobId: 'j', command: 'true' }, context()),
      'INVALID_STATE_TRANSITION',
    );

    expect(await host.provider.restore({ sandboxId: id, fence: 3 }, context())).toEqual({ source: 'workspace' });
    expect(await host.provider.processCount(id)).toBe(1);
    expect(await sh(host.provider, id, 'cat file', 3)).toBe('data\n');
    await stasisError(host.provider.release(release(id, 'TERMINATE', 2, 'late'), context()), 'STALE_FENCE');
  });

  it('SNAPSHOT_AND_TERMINATE uploads a checkpoint with labels, kills everything, and resumes from the local copy', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    await startCounter(host.provider, id);
    await sh(
      host.provider,
      id,
      'mkdir -p src/empty && echo code > src/a.txt && echo rc > ~/.rc && echo env > ../envs/marker',
    );
    const labels = { run: 'r-hash', spec: 's-hash', policy: 'p-hash' };
    const beats: unknown[] = [];
    const receipt = await host.provider.release(
      release(id, 'SNAPSHOT_AND_TERMINATE', 2),
      context({ labels, heartbeat: (details) => beats.push(details) }),
    );
    expect(receipt).toMatchObject({ mode: 'SNAPSHOT_AND_TERMINATE', computeReleased: true, duplicate: false });
    expect(receipt.checkpoint?.uri).toMatch(new RegExp(`checkpoints/${id}/2-[0-9a-f]{16}\\.manifest\\.gz$`));
    expect(beats.length).toBeGreaterThan(0);
    expect(await host.provider.processCount(id)).toBe(0);
    expect(await host.store.exists(receipt.checkpoint?.uri ?? '')).toBe(true);
    expect(await host.provider.listSandboxes()).toEqual([{ sandboxId: id, alive: false, dormant: true }]);

    const checkpoint = receipt.checkpoint;
    if (!checkpoint) throw new Error('no checkpoint');
    expect(await host.provider.restore({ sandboxId: id, fence: 3, checkpoint }, context())).toEqual({
      source: 'local-copy',
      labels,
    });
    expect(await sh(host.provider, id, 'cat src/a.txt ~/.rc ../envs/marker; ls -d src/empty', 3)).toBe(
      'code\nrc\nenv\nsrc/empty\n',
    );
    expect(await host.provider.listSandboxes()).toEqual([{ sandboxId: id, alive: true, dormant: false }]);
  });

  it('a cancelled snapshot thaws the sandbox, leaves no checkpoint and no receipt, and can be retried', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, id).workspace;
    await fs.writeFile(path.join(workspace, 'big.bin'), randomBytes(64 * 1024 * 1024));
    await startCounter(host.provider, id);
    await waitFor('the counter to run', async () => (await readCounter(workspace)) > 2);
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('release cancelled')), 150);
    await expect(
      host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 2), context({ signal: controller.signal })),
    ).rejects.toThrow('release cancelled');
    const before = await readCounter(workspace);
    await waitFor('the counter to advance after the rollback', async () => (await readCounter(workspace)) > before + 2);
    expect(
      (await listTree(path.join(host.dataDir, 'store')).catch(() => [])).filter(
        (p) =>
          p.endsWith('.manifest.gz') || p.endsWith('.manifest.zst') || p.endsWith('.tar.gz') || p.includes('.tmp-'),
      ),
    ).toEqual([]);
    const retried = await host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 2), context());
    expect(retried).toMatchObject({ duplicate: false, computeReleased: true });
    expect(await host.provider.processCount(id)).toBe(0);
  });

  it('restoring the same checkpoint twice does not unpack it over the running sandbox again', async () => {
    const host = await makeHost();
    const other = await makeHost({ store: host.store });
    const id = await host.sandbox();
    await sh(host.provider, id, 'echo v1 > file');
    const { checkpoint } = await host.provider.release(
      release(id, 'SNAPSHOT_AND_TERMINATE', 2),
      context({ labels: { a: 'b' } }),
    );
    if (!checkpoint) throw new Error('no checkpoint');
    expect(await other.provider.restore({ sandboxId: id, fence: 3, checkpoint }, context())).toEqual({
      source: 'checkpoint',
      labels: { a: 'b' },
    });
    await sh(other.provider, id, 'echo v2 > file', 3);
    expect(await other.provider.restore({ sandboxId: id, fence: 3, checkpoint }, context())).toEqual({
      source: 'checkpoint',
      labels: { a: 'b' },
    });
    expect(await sh(other.provider, id, 'cat file', 3)).toBe('v2\n');
    expect(await other.provider.processCount(id)).toBe(1);
  });

  it('refuses to restore a corrupt checkpoint and keeps no half-restored files', async () => {
    const host = await makeHost();
    const other = await makeHost({ store: host.store });
    const id = await host.sandbox();
    const { checkpoint } = await host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 2), context());
    if (!checkpoint) throw new Error('no checkpoint');
    await stasisError(
      other.provider.restore(
        { sandboxId: id, fence: 3, checkpoint: { ...checkpoint, sha256: 'f'.repeat(64) } },
        context(),
      ),
      'CHECKPOINT_INVALID',
    );
    // The other host had no copy of the sandbox: it keeps nothing of the failed restore.
    await expect(fs.access(sandboxPaths(other.dataDir, id).root)).rejects.toThrow();
    // The original host keeps its copy, its raised fence, and no staging leftovers.
    await stasisError(
      host.provider.restore(
        { sandboxId: id, fence: 4, checkpoint: { ...checkpoint, sha256: 'e'.repeat(64) } },
        context(),
      ),
      'CHECKPOINT_INVALID',
    );
    await stasisError(host.provider.attach({ sandboxId: id, fence: 3 }, context()), 'STALE_FENCE');
    const { root, volume } = sandboxPaths(host.dataDir, id);
    expect((await fs.readdir(root)).sort()).toEqual(['meta', 'volume']);
    expect((await fs.readdir(volume)).sort()).toEqual(['envs', 'home', 'workspace']);
  });

  it('close() never touches compute', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    await host.provider.close();
    expect(await host.provider.processCount(id)).toBe(1);
  });
});

describe('local provider: attach after a release that landed late', () => {
  // A stalled release attempt (no heartbeat or cancel gets through) holds the sandbox's lifecycle lock while the
  // resume's attach under the raised fence waits on it; the attempt then finishes and ends the compute. The
  // record says ACTIVE (the release was cancelled before its receipt), so the attach must bring compute back.
  it('brings compute back from the dormant copy, with the files the release snapshotted', async () => {
    let openGate: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    let held: () => void = () => undefined;
    const uploadHeld = new Promise<void>((resolve) => (held = resolve));
    let hold = true;
    const holdPut = async () => {
      if (!hold) return;
      hold = false;
      held();
      await gate;
    };
    const host = await makeHost({
      make: (deps) => {
        const store: CheckpointStore = {
          ...passThrough(deps.store),
          put: async (...args) => (await holdPut(), deps.store.put(...args)),
          putBytes: async (...args) => (await holdPut(), deps.store.putBytes(...args)),
        };
        return createLocalProvider({ ...deps, store });
      },
    });
    const id = await host.sandbox();
    await sh(host.provider, id, 'echo v1 > f.txt');
    const stale = host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 1), context());
    await uploadHeld;
    const attach = host.provider.attach({ sandboxId: id, fence: 2 }, context());
    openGate();
    expect((await stale).computeReleased).toBe(true);
    await attach;
    expect(await host.provider.processCount(id)).toBeGreaterThan(0);
    expect(await sh(host.provider, id, 'cat f.txt', 2)).toBe('v1\n');
    expect(await host.provider.listSandboxes()).toEqual([{ sandboxId: id, alive: true, dormant: false }]);
    await stasisError(
      host.provider.release(release(id, 'SNAPSHOT_AND_TERMINATE', 1, 'late'), context()),
      'STALE_FENCE',
    );
  });

  it('brings compute back on a host-persistent workspace a TERMINATE release left', async () => {
    const host = await makeHost();
    const hostPath = path.join(await tempDir('active'), 'ws');
    const id = await host.sandbox({ hostPath });
    await sh(host.provider, id, 'echo data > file');
    await host.provider.release(release(id, 'TERMINATE', 1), context());
    await host.restart().attach({ sandboxId: id, fence: 2 }, context());
    expect(await host.provider.processCount(id)).toBe(1);
    expect(await sh(host.provider, id, 'cat file', 2)).toBe('data\n');
  });

  it('refuses, under the raised fence, a stopped sandbox no release left a copy of', async () => {
    const host = await makeHost();
    const id = await host.sandbox();
    await host.provider.stop({ sandboxId: id, fence: 1 }, context());
    const err = await stasisError(
      host.provider.attach({ sandboxId: id, fence: 2 }, context()),
      'INVALID_STATE_TRANSITION',
    );
    expect(err.message).toContain('is stopped');
    expect(await host.provider.processCount(id)).toBe(0);
    await stasisError(host.provider.attach({ sandboxId: id, fence: 1 }, context()), 'STALE_FENCE');
  });
});
