import fc from 'fast-check';
import type { AgentAction, AgentDriver } from '../../drivers/api';
import type { RunSnapshot } from '../../common/schemas';
import { backAndMaintained, leftOn } from '../helpers/hosts';
import { storedKeys, testS3 } from '../helpers/s3';
import { startStackOnOwnTemporal, eventually, saw, type TestStack } from '../helpers/stack';

// A model-based test of Runs: random sequences of answer, suspend, resume, cancel and
// "the agent stops thinking" drive the real runWorkflow (with a child Run) on the real
// local provider, on a Temporal server that suggests continue-as-new after a few events
// (so Runs continue as new mid-sequence). After every step the Run must reach exactly the state the model
// predicts, a refused operation must be one of the documented 409/404s and change
// nothing, and no Run is left SUSPENDING or RESUMING. `STASIS_MODEL_RUNS=1000` runs more.

const RUNS = Number(process.env.STASIS_MODEL_RUNS ?? 2);

/** Runs whose driver is thinking, by runId: resolving lets the step return. */
const thinking = new Map<string, () => void>();

/**
 * Spawns a child (which waits for an answer forever), then cycles: think (until the test
 * lets it go) then write a file; ask; hold.
 */
const modelDriver: AgentDriver = {
  name: 'model',
  async step({ runId, state }) {
    const i = (state as number | undefined) ?? 0;
    let action: AgentAction;
    if (i === 0) {
      action = {
        type: 'spawn',
        spec: {
          runId: `${runId}.child`,
          agent: { driver: 'scripted', steps: [{ ask: 'child?' }] },
          sandbox: { provider: 'local' },
        },
      };
    } else if ((i - 1) % 3 === 0) {
      await new Promise<void>((resolve) => thinking.set(runId, resolve));
      action = { type: 'writeFile', path: 'step.txt', content: String(i) };
    } else if ((i - 1) % 3 === 1) action = { type: 'interaction', kind: 'approval', prompt: `step ${i}?` };
    else action = { type: 'hold', reason: `step ${i}` };
    return { action, state: i + 1 };
  },
};

type Stable = 'thinking' | 'manual' | 'waiting' | 'held' | 'cancelled';
interface Model {
  state: Stable;
  /** Interactions asked so far (the pending one, when waiting, is int-<asked>). */
  asked: number;
  /**
   * Thinking after a resume: the sandbox comes back with the agent's next action, so the Run is
   * RESUMING while the agent thinks (a deferred resume), and a suspend is still taken.
   */
  deferred?: boolean;
  /**
   * The Run's execution (Temporal run id) when the deferred resume was taken. A Run that continues as
   * new with a resume deferred brings its sandbox back first (PATCH_CAN_BRINGS_BACK), so once the
   * execution has changed the Run thinks ACTIVE; this test's server suggests continue-as-new early.
   */
  resumedIn?: string;
}
interface Real {
  runId: string;
}

const s3 = testS3();
let stack: TestStack;
beforeAll(async () => {
  stack = await startStackOnOwnTemporal(30, { worker: { drivers: [modelDriver] } });
});
afterAll(async () => {
  for (const resolve of thinking.values()) resolve();
  await stack?.stop();
});

/** The Temporal run id of the Run's current execution. */
async function execution(runId: string): Promise<string> {
  return (await stack.temporal.workflow.getHandle(runId).describe()).runId;
}

/** Waits until the Run is in `model`'s state, and checks nothing is half-way. */
async function reached(model: Model, runId: string): Promise<void> {
  await eventually(
    async () => {
      const snapshot = saw(await stack.client.runs.get(runId));
      const view = await stack.client.runs.resource(runId);
      saw({ snapshot, view, model, thinking: thinking.has(runId) });
      const pending = snapshot.interactions.filter((i) => i.status === 'pending').map((i) => i.id);
      switch (model.state) {
        case 'thinking': {
          const phase =
            model.deferred && (view.phase !== 'ACTIVE' || (await execution(runId)) === model.resumedIn)
              ? 'RESUMING'
              : 'ACTIVE';
          return thinking.has(runId) && snapshot.status === 'RUNNING' && view.phase === phase && pending.length === 0;
        }
        case 'manual':
        case 'held':
          return (
            snapshot.status === 'RUNNING' &&
            view.phase === 'SUSPENDED' &&
            view.suspension?.reason === (model.state === 'manual' ? 'MANUAL' : 'POLICY_HOLD') &&
            pending.length === 0
          );
        case 'waiting':
          return snapshot.status === 'WAITING' && view.phase === 'SUSPENDED' && pending.join() === `int-${model.asked}`;
        case 'cancelled':
          return snapshot.status === 'CANCELLED' && view.phase === 'ACTIVE';
      }
    },
    60_000,
    `run in state ${model.state}`,
  );
  const interactions = (await stack.client.runs.get(runId)).interactions;
  expect(interactions).toHaveLength(model.asked);
  // The child lives as long as its parent, through the parent's continue-as-new.
  if (model.state !== 'cancelled')
    expect(['RUNNING', 'WAITING']).toContain((await stack.client.runs.get(`${runId}.child`)).status);
}

/**
 * An accepted operation's answer: every Update the test sends answers within two minutes (a Run that
 * never answers one fails here, naming it, instead of hanging the suite).
 */
async function answered<T>(op: Promise<T>, what: string, model: Model): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${what} not answered in 120 s (model ${JSON.stringify(model)})`)),
      120_000,
    );
  });
  try {
    return await Promise.race([op, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** A refused operation: one of the documented refusals, and the Run stays where it was. */
async function refused(model: Model, real: Real, op: Promise<unknown>, codes: string[]): Promise<void> {
  const err = (await answered(op, 'refused operation', model).then(
    (value) => ({ accepted: value }),
    (e: unknown) => e,
  )) as { code?: string; httpStatus?: number; accepted?: RunSnapshot };
  expect(err.accepted).toBeUndefined();
  expect(codes).toContain(err.code);
  expect([404, 409]).toContain(err.httpStatus);
  await reached(model, real.runId);
}

class Answer implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(model: Model, real: Real) {
    const id = `int-${Math.max(1, model.asked)}`;
    const op = stack.client.runs.respond(real.runId, id, { decision: 'approve' });
    if (model.state !== 'waiting') {
      const codes = model.asked === 0 ? ['NOT_FOUND'] : ['ALREADY_ANSWERED'];
      return refused(model, real, op, model.state === 'cancelled' ? [...codes, 'INVALID_STATE_TRANSITION'] : codes);
    }
    await answered(op, 'answer', model);
    model.state = 'held';
    await reached(model, real.runId);
  }
  toString = () => 'answer';
}

class Suspend implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(model: Model, real: Real) {
    const op = stack.client.runs.suspend(real.runId);
    if (model.state !== 'thinking') return refused(model, real, op, ['INVALID_STATE_TRANSITION']);
    // Taken up between steps: the agent's current step ends first.
    thinking.get(real.runId)?.();
    thinking.delete(real.runId);
    await answered(op, 'suspend', model);
    model.state = 'manual';
    model.deferred = false;
    await reached(model, real.runId);
  }
  toString = () => 'suspend';
}

class Resume implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(model: Model, real: Real) {
    // Before the resume is sent: a continue-as-new right after it would otherwise go unseen.
    const resumedIn = await execution(real.runId);
    const op = stack.client.runs.resume(real.runId);
    if (model.state !== 'manual' && model.state !== 'held')
      return refused(model, real, op, ['INVALID_STATE_TRANSITION']);
    // Answered once the resume is taken: the sandbox comes back with the agent's next action.
    await answered(op, 'resume', model);
    if (model.state === 'manual') {
      model.asked += 1;
      model.state = 'waiting';
    } else {
      model.state = 'thinking';
      model.deferred = true;
      model.resumedIn = resumedIn;
    }
    await reached(model, real.runId);
  }
  toString = () => 'resume';
}

class Cancel implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(model: Model, real: Real) {
    const op = stack.client.runs.cancel(real.runId);
    if (model.state === 'cancelled') return refused(model, real, op, ['INVALID_STATE_TRANSITION']);
    await answered(op, 'cancel', model);
    thinking.get(real.runId)?.();
    thinking.delete(real.runId);
    model.state = 'cancelled';
    model.deferred = false;
    await reached(model, real.runId);
    // A cancelled parent cancels its child; its compute is released, nothing is left half-way.
    await eventually(
      async () => saw(await stack.client.runs.get(`${real.runId}.child`)).status === 'CANCELLED',
      60_000,
      'child cancelled',
    );
  }
  toString = () => 'cancel';
}

/** The agent stops thinking: it writes its file and asks. */
class StopThinking implements fc.AsyncCommand<Model, Real> {
  check = (model: Readonly<Model>) => model.state === 'thinking';
  async run(model: Model, real: Real) {
    thinking.get(real.runId)?.();
    thinking.delete(real.runId);
    model.asked += 1;
    model.state = 'waiting';
    model.deferred = false;
    await reached(model, real.runId);
  }
  toString = () => 'stop thinking';
}

test(`${RUNS} random sequences of Run operations keep the Run where the model says`, async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.commands(
        [
          fc.constant(new Answer()),
          fc.constant(new Suspend()),
          fc.constant(new Resume()),
          fc.constant(new Cancel()),
          fc.constant(new StopThinking()),
        ],
        {
          maxCommands: 8,
        },
      ),
      async (commands) => {
        const { runId } = await stack.client.runs.start({
          agent: { driver: 'model' },
          sandbox: { provider: 'local' },
          policy: { pauseMode: 'DETACH' },
        });
        const model: Model = { state: 'thinking', asked: 0 };
        await reached(model, runId);
        await fc.asyncModelRun(() => ({ model, real: { runId } }), commands);
        if (model.state !== 'cancelled') await new Cancel().run(model, { runId });
      },
    ),
    { numRuns: RUNS, endOnFailure: true },
  );
}, 3_600_000);

test(`${RUNS * 2} answers racing retention expiry: accepted means the Run goes on, refused means STALE_SANDBOX_ROUTE and EXPIRED`, async () => {
  await fc.assert(
    fc.asyncProperty(fc.integer({ min: 0, max: 3_000 }), async (delayMs) => {
      const { runId } = await stack.client.runs.start({
        agent: { driver: 'scripted', steps: [{ ask: 'in time?' }, { complete: 'answered in time' }] },
        sandbox: { provider: 'local' },
        policy: { suspendedRetentionSeconds: 1, pauseMode: 'DETACH' },
      });
      await eventually(
        async () => {
          // Released: a poll under load can come after the whole retention, when the Run has expired.
          const view = saw(await stack.client.runs.resource(runId));
          return view.phase === 'SUSPENDED' || view.record.releasedAt !== undefined;
        },
        60_000,
        'suspended',
      );
      // The answer is sent at a random moment around the end of retention.
      await new Promise((r) => setTimeout(r, delayMs));
      const answer = await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }).then(
        () => undefined,
        (err: unknown) => err as { code?: string; httpStatus?: number },
      );
      const result = await stack.temporal.workflow
        .getHandle(runId)
        .result()
        .catch(() => undefined);
      const snapshot = await stack.client.runs.get(runId);
      if (answer === undefined) {
        expect(result).toBe('answered in time');
        expect(snapshot.interactions[0].status).toBe('answered');
      } else {
        expect(answer).toMatchObject({ code: 'STALE_SANDBOX_ROUTE', httpStatus: 409 });
        expect(snapshot).toMatchObject({ status: 'EXPIRED', error: { code: 'SUSPEND_EXPIRED' } });
        expect(snapshot.interactions[0].status).toBe('expired');
      }
      expect((await stack.client.runs.resource(runId)).phase).toBe('ACTIVE');
    }),
    { numRuns: RUNS * 2, endOnFailure: true },
  );
}, 3_600_000);

test(`${RUNS} Runs whose host goes away at a random moment around their retention expiry still expire, and the host cleans up when back`, async () => {
  await fc.assert(
    fc.asyncProperty(fc.integer({ min: 0, max: 3_000 }), async (delayMs) => {
      // Only host B serves the queue while the Run starts, so its sandbox lives there.
      await stack.startWorker('host-b');
      await stack.stopWorker('host-a');
      const { runId } = await stack.client.runs.start({
        agent: { driver: 'scripted', steps: [{ writeFile: { path: 'a.txt', content: 'work' } }, { ask: 'anyone?' }] },
        sandbox: { provider: 'local' },
        policy: { suspendedRetentionSeconds: 2 },
      });
      const sandboxId = `${runId}-sbx`;
      await eventually(
        async () => {
          // Released: a poll under load can come after the whole retention, when the Run has expired.
          const view = saw(await stack.client.runs.resource(runId));
          return view.phase === 'SUSPENDED' || view.record.releasedAt !== undefined;
        },
        60_000,
        'suspended',
      );
      // Host B goes away before, during or after the expiry; A serves the shared queue.
      await new Promise((r) => setTimeout(r, delayMs));
      await stack.stopWorker('host-b');
      await stack.startWorker('host-a');
      await expect(stack.temporal.workflow.getHandle(runId).result()).rejects.toThrow();
      expect(await stack.client.runs.get(runId)).toMatchObject({
        status: 'EXPIRED',
        error: { code: 'SUSPEND_EXPIRED' },
      });
      expect((await stack.client.runs.resource(runId)).record.state).toBe('DESTROYED');
      expect(await storedKeys(s3, sandboxId)).toEqual([]);
      // Host B is back: whatever the expiry could not remove there, its maintenance removes.
      await backAndMaintained(stack, 'host-b');
      await stack.stopWorker('host-b');
      expect(await leftOn(stack, 'host-b', sandboxId)).toEqual({ directory: false, processes: 0 });
    }),
    { numRuns: RUNS, endOnFailure: true },
  );
}, 3_600_000);
