import { existsSync } from 'node:fs';
import fc from 'fast-check';
import { StasisClient } from '../../client';
import type { SandboxState, SandboxView } from '../../common/schemas';
import { killSandbox, scanSandboxProcesses } from '../../providers/processes';
import { sandboxPaths } from '../../providers/sandbox-state';
import { backAndMaintained, evictDormantCopies, hostDataDir, leftOn } from '../helpers/hosts';
import { faultyProvider, type ReleaseFaults } from '../helpers/faulty-provider';
import { storedKeys, testS3 } from '../helpers/s3';
import { useStack, startStack, eventually } from '../helpers/stack';
import { IDEMPOTENT, LEGAL, type UserOp } from '../helpers/transition-table';

// Model-based test: random sequences of operations and faults drive the real sandboxWorkflow and the
// real provider (processes, files, MinIO); after every step the real sandbox must match a small model
// and hold the invariants. STASIS_MODEL_RUNS=<n> runs n sequences (a handful by default, for npm test).

const RUNS = Number(process.env.STASIS_MODEL_RUNS ?? 4);
const HOST = 'host-a';
/** A second host, up only while a sandbox that expires is made on it. */
const OTHER_HOST = 'host-b';
const faults: ReleaseFaults = { calls: [] };
const s3 = testS3();

const stack = useStack(() => startStack({ hostId: HOST, worker: { providers: [faultyProvider(faults)] } }));

interface Model {
  state: SandboxState;
  /** What each file holds: everything acknowledged must still be there. */
  files: Map<string, string>;
}

interface Real {
  id: string;
  /** Steps taken, for the failure message. */
  log: string[];
}

type Outcome<T> =
  { ok: true; value: T } | { ok: false; error: { code?: string; httpStatus?: number; message?: string } };
const settle = <T>(p: Promise<T>): Promise<Outcome<T>> =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (error: { code?: string }) => ({ ok: false as const, error }),
  );

const hostDir = () => hostDataDir(stack, HOST);
const processes = async (id: string) => (await scanSandboxProcesses(HOST)).get(id)?.length ?? 0;
const FILE_STATES: SandboxState[] = ['created', 'running', 'stopped', 'paused', 'failed'];

/** The documented answer of a state change from the model's state, and the model's next state. */
async function expectChange(op: UserOp, m: Model, r: Real, outcome: Outcome<SandboxView>): Promise<void> {
  const key = `${m.state}/${op}`;
  r.log.push(`${op} from ${m.state}: ${outcome.ok ? outcome.value.state : outcome.error.code}`);
  if (m.state === 'destroyed') {
    expect(outcome).toMatchObject({ ok: false, error: { code: 'NOT_FOUND', httpStatus: 404 } });
  } else if (LEGAL[key]) {
    expect(outcome).toMatchObject({ ok: true, value: { state: LEGAL[key] } });
    m.state = LEGAL[key];
    if (m.state === 'destroyed') m.files.clear();
  } else if (IDEMPOTENT.has(key)) {
    expect(outcome).toMatchObject({ ok: true, value: { state: m.state } });
  } else {
    expect(outcome).toMatchObject({
      ok: false,
      error: { code: 'INVALID_STATE_TRANSITION', httpStatus: 409, message: 'sandbox: invalid state transition' },
    });
  }
}

/** The invariants, checked after every step. */
async function checkInvariants(m: Model, r: Real): Promise<void> {
  const seen = await settle(stack.client.sandboxes.get(r.id));
  if (m.state === 'destroyed') {
    expect(seen).toMatchObject({ ok: false, error: { code: 'NOT_FOUND' } });
    expect(existsSync(sandboxPaths(hostDir(), r.id).root)).toBe(false);
    expect(await storedKeys(s3, r.id)).toEqual([]);
    expect(await processes(r.id)).toBe(0);
    return;
  }
  if (!seen.ok) throw new Error(`sandbox ${r.id} unreadable: ${JSON.stringify(seen.error)} after ${r.log.join(' → ')}`);
  expect({ state: seen.value.state, after: r.log }).toEqual({ state: m.state, after: r.log });
  // Nothing stays half-way once its operation answered.
  expect(['RESTORING', 'RELEASING', 'RELEASE_BLOCKED', 'DESTROYING']).not.toContain(seen.value.record.state);
  if (m.state === 'suspended') {
    expect(seen.value.record).toMatchObject({ state: 'RELEASED', checkpoint: expect.anything() });
  }
  if (m.state === 'suspended' || m.state === 'stopped' || m.state === 'created' || m.state === 'lost') {
    expect(await processes(r.id)).toBe(0);
  }
}

/** Every file the model knows has its acknowledged content. */
async function checkFiles(m: Model, r: Real): Promise<void> {
  for (const [file, content] of m.files) {
    const read = await settle(stack.client.sandboxes.readFile(r.id, file));
    expect({ file, read: read.ok ? read.value.toString() : read.error.code, after: r.log }).toEqual({
      file,
      read: content,
      after: r.log,
    });
  }
}

class Change implements fc.AsyncCommand<Model, Real> {
  constructor(readonly op: UserOp) {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    const from = m.state;
    await expectChange(this.op, m, r, await settle(stack.client.sandboxes[this.op](r.id)));
    if (from === 'suspended' && m.state === 'running') await checkFiles(m, r);
    await checkInvariants(m, r);
  }
  toString = () => this.op;
}

class WriteFile implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly file: string,
    readonly content: string,
  ) {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    const outcome = await settle(stack.client.sandboxes.writeFile(r.id, this.file, Buffer.from(this.content)));
    r.log.push(`write ${this.file} in ${m.state}: ${outcome.ok ? 'ok' : outcome.error.code}`);
    if (m.state === 'destroyed') expect(outcome).toMatchObject({ ok: false, error: { code: 'NOT_FOUND' } });
    else if (FILE_STATES.includes(m.state)) {
      expect(outcome).toMatchObject({ ok: true });
      m.files.set(this.file, this.content);
    } else expect(outcome).toMatchObject({ ok: false, error: { code: 'INVALID_STATE_TRANSITION', httpStatus: 409 } });
    await checkInvariants(m, r);
  }
  toString = () => `write(${this.file})`;
}

/** A quick command that leaves a file behind, a background process, or a slow command a suspend must not cut. */
class Exec implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly kind: 'quick' | 'background' | 'slow',
    readonly file: string,
    readonly content: string,
  ) {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    const command =
      this.kind === 'background'
        ? 'sleep 600 >/dev/null 2>&1 &'
        : `${this.kind === 'slow' ? 'sleep 1; ' : ''}mkdir -p "$(dirname ${this.file})" && printf %s '${this.content}' > ${this.file}`;
    const before = await processes(r.id);
    const exec = settle(stack.client.sandboxes.exec(r.id, { command }));
    if (this.kind === 'slow' && m.state === 'running') {
      // While it runs, a suspend is refused at once.
      await eventually(async () => (await processes(r.id)) > before, 20_000, 'slow command running');
      await expect(stack.client.sandboxes.suspend(r.id)).rejects.toMatchObject({
        code: 'SANDBOX_SUSPEND_BUSY',
        httpStatus: 409,
      });
    }
    const outcome = await exec;
    r.log.push(`exec ${this.kind} in ${m.state}: ${outcome.ok ? outcome.value.exitCode : outcome.error.code}`);
    if (m.state === 'destroyed') expect(outcome).toMatchObject({ ok: false, error: { code: 'NOT_FOUND' } });
    else if (m.state === 'running') {
      expect(outcome).toMatchObject({ ok: true, value: { exitCode: 0 } });
      if (this.kind !== 'background') m.files.set(this.file, this.content);
    } else expect(outcome).toMatchObject({ ok: false, error: { code: 'INVALID_STATE_TRANSITION', httpStatus: 409 } });
    await checkInvariants(m, r);
  }
  toString = () => `exec-${this.kind}(${this.file})`;
}

/** Disk pressure on the host evicts dormant copies: a later resume has to come from the checkpoint. */
class EvictDormant implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    const evicted = await evictDormantCopies(stack, HOST);
    r.log.push(`evict${evicted.includes(r.id) ? ' (evicted)' : ''}`);
    if (m.state === 'suspended') expect(evicted).toContain(r.id);
    await checkInvariants(m, r);
  }
  toString = () => 'evict';
}

/** One restore refused for good (its checkpoint unavailable): the sandbox stays suspended, and the next resume works. */
class FailedRestore implements fc.AsyncCommand<Model, Real> {
  check = (m: Readonly<Model>) => m.state === 'suspended';
  async run(m: Model, r: Real): Promise<void> {
    let used = false;
    faults.restorePlan = (id) => (id === r.id && !used ? ((used = true), 'unavailable') : undefined);
    const outcome = await settle(stack.client.sandboxes.resume(r.id));
    faults.restorePlan = undefined;
    r.log.push(`failed restore: ${outcome.ok ? outcome.value.state : outcome.error.code}`);
    expect(outcome).toMatchObject({ ok: false, error: { code: 'NOT_FOUND' } });
    await checkInvariants(m, r);
  }
  toString = () => 'failed-restore';
}

/** The worker restarts; `hostToo` means the host did, so the sandbox's processes died with it. */
class Restart implements fc.AsyncCommand<Model, Real> {
  constructor(readonly hostToo: boolean) {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    await stack.stopWorker(HOST);
    if (this.hostToo) await killSandbox({ sandboxId: r.id, hostId: HOST });
    await stack.startWorker(HOST);
    r.log.push(this.hostToo ? 'host restart' : 'worker restart');
    if (this.hostToo && (m.state === 'running' || m.state === 'paused')) {
      m.state = 'lost';
      await eventually(
        async () => (await stack.client.sandboxes.get(r.id)).state === 'lost',
        30_000,
        'lost after reconcile',
      );
    }
    await checkInvariants(m, r);
  }
  toString = () => (this.hostToo ? 'host-restart' : 'worker-restart');
}

/** Another sandbox's lifecycle policy fires while this one is driven: idle pauses it, ttl destroys it entirely. */
class PolicyExpiry implements fc.AsyncCommand<Model, Real> {
  constructor(readonly kind: 'idle' | 'ttl') {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    const policy = this.kind === 'idle' ? { timeout: '1s' } : { ttl: '3s' };
    const { sandboxId } = await stack.client.sandboxes.create({ provider: 'faulty', policy });
    await stack.client.sandboxes.start(sandboxId);
    r.log.push(`${this.kind} expiry of ${sandboxId}`);
    if (this.kind === 'idle') {
      await eventually(
        async () => (await stack.client.sandboxes.get(sandboxId)).state === 'paused',
        30_000,
        'idle pause',
      );
      await stack.client.sandboxes.destroy(sandboxId);
    } else {
      // The ttl may fire first: then the suspend races its destroy (409) or finds nothing left (404).
      await stack.client.sandboxes
        .suspend(sandboxId)
        .catch((err: { code?: string }) => expect(['NOT_FOUND', 'INVALID_STATE_TRANSITION']).toContain(err.code));
      await eventually(
        async () =>
          stack.client.sandboxes.get(sandboxId).then(
            () => false,
            (err: { code?: string }) => err.code === 'NOT_FOUND',
          ),
        30_000,
        'destroyed by ttl',
      );
    }
    expect(existsSync(sandboxPaths(hostDir(), sandboxId).root)).toBe(false);
    expect(await storedKeys(s3, sandboxId)).toEqual([]);
    expect(await processes(sandboxId)).toBe(0);
    await checkInvariants(m, r);
  }
  toString = () => `${this.kind}-expiry`;
}

/**
 * Another sandbox is suspended past retention; with `deadHost` its host's worker is gone for good
 * when it expires. The expiry ends all the same: every checkpoint deleted, its route stale, and
 * what the dead host holds removed by that host's maintenance once it is back.
 */
class RetentionExpiry implements fc.AsyncCommand<Model, Real> {
  constructor(readonly deadHost: boolean) {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    // Long enough that the host is gone before the expiry when it should be.
    const expiring = new StasisClient(stack.temporal, {
      taskQueue: stack.config.STASIS_TASK_QUEUE,
      suspendedRetentionSeconds: this.deadHost ? 20 : 2,
    }).sandboxes;
    const host = this.deadHost ? OTHER_HOST : HOST;
    if (this.deadHost) {
      await stack.startWorker(OTHER_HOST);
      await stack.stopWorker(HOST);
    }
    const { sandboxId } = await expiring.create({ provider: 'faulty' });
    await expiring.start(sandboxId);
    await expiring.writeFile(sandboxId, 'kept.txt', Buffer.from('until expiry'));
    await expiring.suspend(sandboxId);
    if (this.deadHost) {
      await stack.stopWorker(OTHER_HOST);
      await stack.startWorker(HOST);
    }
    r.log.push(`retention expiry of ${sandboxId}${this.deadHost ? ` on a dead ${OTHER_HOST}` : ''}`);
    const expired = await eventually(
      async () => {
        const view = await expiring.get(sandboxId);
        return view.error?.code === 'SUSPEND_EXPIRED' && view.record.state === 'DESTROYED' ? view : undefined;
      },
      120_000,
      'expired',
    );
    if (this.deadHost) expect(expired.record.lastError).toMatch(/host host-b did not finish/);
    expect(await storedKeys(s3, sandboxId)).toEqual([]);
    await expect(expiring.resume(sandboxId)).rejects.toMatchObject({ code: 'STALE_SANDBOX_ROUTE', httpStatus: 409 });
    if (this.deadHost) {
      const destroyed = await backAndMaintained(stack, OTHER_HOST);
      await stack.stopWorker(OTHER_HOST);
      expect(destroyed).toContain(sandboxId);
    }
    await expect(expiring.destroy(sandboxId)).resolves.toMatchObject({ state: 'destroyed' });
    expect(await leftOn(stack, host, sandboxId)).toEqual({ directory: false, processes: 0 });
    await checkInvariants(m, r);
  }
  toString = () => `retention-expiry${this.deadHost ? '-dead-host' : ''}`;
}

const fileName = fc.constantFrom('a.txt', 'dir/b.txt', 'dir/sub/c.bin', 'd');
const content = fc.stringMatching(/^[a-z0-9]{0,16}$/);

const commands = [
  fc.constantFrom<UserOp>('start', 'stop', 'pause', 'resume', 'suspend').map((op) => new Change(op)),
  fc.constantFrom<UserOp>('start', 'suspend', 'resume').map((op) => new Change(op)),
  fc.constant(new Change('destroy')),
  fc.tuple(fileName, content).map(([f, c]) => new WriteFile(f, c)),
  fc
    .tuple(fc.constantFrom('quick', 'background', 'slow' as const), fileName, content)
    .map(([k, f, c]) => new Exec(k, f, c)),
  fc.constant(new EvictDormant()),
  fc.constant(new FailedRestore()),
  fc.boolean().map((hostToo) => new Restart(hostToo)),
  fc.constantFrom('idle', 'ttl' as const).map((kind) => new PolicyExpiry(kind)),
  fc.boolean().map((deadHost) => new RetentionExpiry(deadHost)),
];

test(
  `random sequences (${RUNS}) keep the sandbox consistent with its model`,
  async () => {
    await fc.assert(
      fc.asyncProperty(fc.commands(commands, { maxCommands: 14 }), async (cmds) => {
        const { sandboxId } = await stack.client.sandboxes.create({ provider: 'faulty' });
        const model: Model = { state: 'created', files: new Map() };
        const real: Real = { id: sandboxId, log: [] };
        await fc.asyncModelRun(() => ({ model, real }), cmds);
        // Its end: destroy leaves nothing behind.
        if (model.state !== 'destroyed') await new Change('destroy').run(model, real);
        await checkInvariants(model, real);
      }),
      { numRuns: RUNS, endOnFailure: true },
    );
  },
  60_000 + RUNS * 240_000,
);
