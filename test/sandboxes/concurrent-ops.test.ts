import { existsSync } from 'node:fs';
import fc from 'fast-check';
import type { SandboxView } from '../../common/schemas';
import { scanSandboxProcesses } from '../../providers/processes';
import { readState, sandboxPaths } from '../../providers/sandbox-state';
import { evictDormantCopies, hostDataDir } from '../helpers/hosts';
import { storedKeys, testS3 } from '../helpers/s3';
import { useStack, startStack } from '../helpers/stack';

// State changes, commands and file calls fired concurrently, in random orders, at one sandbox.
// Afterwards the record must say what the host has, every acknowledged write must be there (also
// after a round trip through the checkpoint, from the store when the local copy is evicted), the
// sandbox must still be movable, and a destroy must leave nothing on the host or in the store.

const HOST = 'host-a';
const s3 = testS3();
const stack = useStack(() => startStack({ hostId: HOST }));

type Op =
  | { kind: 'change'; op: 'start' | 'stop' | 'pause' | 'resume' | 'suspend' | 'destroy' }
  | { kind: 'write'; n: number }
  | { kind: 'read' }
  | { kind: 'exec'; n: number; slow: boolean }
  | { kind: 'bg' };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc
      .constantFrom('start', 'stop', 'pause', 'resume', 'suspend')
      .map((op) => ({ kind: 'change' as const, op })),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'change' as const, op: 'destroy' as const }) },
  { weight: 3, arbitrary: fc.integer({ min: 0, max: 1e6 }).map((n) => ({ kind: 'write' as const, n })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'read' as const }) },
  {
    weight: 3,
    arbitrary: fc
      .record({ n: fc.integer({ min: 0, max: 1e6 }), slow: fc.boolean() })
      .map((e) => ({ kind: 'exec' as const, ...e })),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'bg' as const }) },
);

type Outcome = { ok: true; value: unknown } | { ok: false; code?: string; message?: string };
const settle = (p: Promise<unknown>): Promise<Outcome> =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (error: { code?: string; message?: string }) => ({ ok: false as const, code: error.code, message: error.message }),
  );

function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`STUCK: ${what} did not answer in ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

const processes = async (id: string) => (await scanSandboxProcesses(HOST)).get(id) ?? [];

async function fire(id: string, op: Op, tag: string, acked: Map<string, string>): Promise<string> {
  const c = stack.client.sandboxes;
  let out: Outcome;
  switch (op.kind) {
    case 'change':
      out = await settle(c[op.op](id));
      return `${op.op}:${out.ok ? (out.value as SandboxView).state : out.code}`;
    case 'write': {
      const file = `w-${tag}.txt`;
      const content = `write ${op.n}`;
      out = await settle(c.writeFile(id, file, Buffer.from(content)));
      if (out.ok) acked.set(file, content);
      return `write ${file}:${out.ok ? 'ok' : out.code}`;
    }
    case 'read':
      out = await settle(c.readFile(id, 'base.txt'));
      return `read:${out.ok ? 'ok' : out.code}`;
    case 'exec': {
      const file = `e-${tag}.txt`;
      const content = `exec ${op.n}`;
      out = await settle(
        c.exec(id, { command: `${op.slow ? 'sleep 0.7; ' : ''}printf %s '${content}' > ${file} && sync ${file}` }),
      );
      const exit = out.ok ? (out.value as { exitCode: number }).exitCode : undefined;
      if (out.ok && exit === 0) acked.set(file, content);
      return `exec ${file}:${out.ok ? `exit ${exit}` : out.code}`;
    }
    case 'bg':
      out = await settle(c.exec(id, { command: 'sleep 300 >/dev/null 2>&1 &' }));
      return `bg:${out.ok ? 'ok' : out.code}`;
  }
}

const TRANSIENT = ['RESTORING', 'RELEASING', 'RELEASE_BLOCKED', 'DESTROYING'];

async function checkConsistent(id: string, log: string[]): Promise<SandboxView | undefined> {
  const seen = await settle(stack.client.sandboxes.get(id));
  const where = log.join(' | ');
  const paths = sandboxPaths(hostDataDir(stack, HOST), id);
  if (!seen.ok) {
    expect({ code: seen.code, where }).toEqual({ code: 'NOT_FOUND', where });
    expect({ dir: existsSync(paths.root), where }).toEqual({ dir: false, where });
    expect({ procs: (await processes(id)).length, where }).toEqual({ procs: 0, where });
    expect({ keys: await storedKeys(s3, id), where }).toEqual({ keys: [], where });
    return undefined;
  }
  const view = seen.value as SandboxView;
  expect({ record: view.record.state, where, transient: TRANSIENT.includes(view.record.state) }).toMatchObject({
    transient: false,
  });
  const host = await readState(paths);
  const procs = await processes(id);
  const fact = {
    state: view.state,
    host: host?.status,
    dormant: host?.dormant !== undefined,
    procs: procs.length,
    where,
  };
  switch (view.state) {
    case 'running':
      expect(fact).toMatchObject({ host: 'running', dormant: false });
      expect(fact.procs).toBeGreaterThan(0);
      break;
    case 'paused':
      expect(fact).toMatchObject({ host: 'paused', dormant: false });
      break;
    case 'stopped':
      expect(fact).toMatchObject({ host: 'stopped', procs: 0 });
      break;
    case 'suspended':
      expect(fact).toMatchObject({ procs: 0 });
      expect(view.record).toMatchObject({ state: 'RELEASED', checkpoint: expect.anything() });
      break;
    default:
      throw new Error(`unexpected state ${view.state}: ${where}`);
  }
  return view;
}

/** Brings the sandbox to running by a legal path, or says it is gone. */
async function toRunning(id: string, log: string[]): Promise<boolean> {
  for (let i = 0; i < 3; i++) {
    const seen = await settle(stack.client.sandboxes.get(id));
    if (!seen.ok) return false;
    const state = (seen.value as SandboxView).state;
    if (state === 'running') return true;
    const op = state === 'stopped' || state === 'created' ? 'start' : 'resume';
    const r = await settle(withDeadline(stack.client.sandboxes[op](id), 120_000, `${op} to running`));
    log.push(`fixup ${op}:${r.ok ? (r.value as SandboxView).state : `${r.code} ${r.message}`}`);
  }
  throw new Error(`sandbox ${id} cannot be brought to running: ${log.join(' | ')}`);
}

test('concurrent operations on one sandbox leave it consistent, movable, and keep every acknowledged write', async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(opArb, { minLength: 2, maxLength: 6 }), fc.boolean(), async (ops, evict) => {
      const { sandboxId: id } = await stack.client.sandboxes.create({ provider: 'local' });
      await stack.client.sandboxes.start(id);
      await stack.client.sandboxes.writeFile(id, 'base.txt', Buffer.from('base'));
      const acked = new Map<string, string>([['base.txt', 'base']]);
      const log: string[] = [`ops ${JSON.stringify(ops)}`];
      const t0 = Date.now();
      const all = Promise.all(
        ops.map((op, i) => fire(id, op, String(i), acked).then((r) => `${r} @${Date.now() - t0}ms`)),
      );
      let results = await Promise.race([all, new Promise<undefined>((r) => setTimeout(() => r(undefined), 45_000))]);
      if (!results) {
        // A command frozen by a pause waits for the resume: resume it (by design, not stuck).
        const r = await settle(stack.client.sandboxes.resume(id));
        log.push(`ops pending after 45 s; resume:${r.ok ? (r.value as SandboxView).state : r.code}`);
        results = await withDeadline(all, 120_000, `ops ${JSON.stringify(ops)} after resume`);
      }
      log.push(...results);
      const view = await checkConsistent(id, log);
      if (view) {
        // Every acknowledged write survives a round trip through the checkpoint (local copy evicted or not).
        if (!(await toRunning(id, log))) throw new Error(`lost sandbox: ${log.join(' | ')}`);
        await checkConsistent(id, log);
        const s = await settle(withDeadline(stack.client.sandboxes.suspend(id), 120_000, 'final suspend'));
        log.push(`final suspend:${s.ok ? (s.value as SandboxView).state : `${s.code} ${s.message}`}`);
        expect({ s: s.ok, log }).toMatchObject({ s: true });
        await checkConsistent(id, log);
        if (evict) await evictDormantCopies(stack, HOST);
        const r = await settle(withDeadline(stack.client.sandboxes.resume(id), 120_000, 'final resume'));
        log.push(`final resume:${r.ok ? (r.value as SandboxView).state : `${r.code} ${r.message}`}`);
        await checkConsistent(id, log);
        for (const [file, content] of acked) {
          const read = await settle(stack.client.sandboxes.readFile(id, file));
          expect({ file, read: read.ok ? String(read.value) : read.code, log }).toEqual({ file, read: content, log });
        }
        const d = await settle(withDeadline(stack.client.sandboxes.destroy(id), 120_000, 'destroy'));
        expect({ d: d.ok ? 'ok' : `${d.code} ${d.message}`, log }).toEqual({ d: 'ok', log });
        await checkConsistent(id, log);
      }
    }),
    { numRuns: 8, endOnFailure: true },
  );
}, 1_800_000);
