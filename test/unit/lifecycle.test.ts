import fc from 'fast-check';
import type { PauseMode, RunStatus, SandboxState } from '../../common/schemas';
import { RESOURCE_STATES } from '../../common/wire-checks';
import {
  admitRunOp,
  blockingChildren,
  checkArity,
  childPingDelayMs,
  blockingJobs,
  checkRespond,
  choosePauseMode,
  continueAsNewDue,
  decideExec,
  decideFileAccess,
  decideHistoryRoom,
  decideSandboxOp,
  DESTROYABLE,
  destroyingState,
  HISTORY_GUARD_BYTES,
  CALL_HISTORY_MAX_BYTES,
  hashMismatches,
  isRejection,
  isReleaseBlocked,
  jobsToCancel,
  nextRunState,
  planResume,
  fusesWithResume,
  HISTORY_LENGTH_HIGH_WATER,
  HISTORY_SIZE_HIGH_WATER_BYTES,
  type RunHistoryFacts,
  receiptProblem,
  staysReleased,
  type ReleaseReceiptFacts,
  releaseBackoffMs,
  releaseIdempotencyKey,
  RUN_STATES,
  RUN_TRANSITIONS,
  SANDBOX_TRANSITIONS,
  type JobState,
  type RunFacts,
  type RunState,
  type SandboxCall,
  type SandboxOp,
  settleAtEnd,
  waitsForJobs,
  RUN_ITEM_HISTORY_MAX_BYTES,
} from '../../workflows/lifecycle';
import { IDEMPOTENT, LEGAL, USER_OPS } from '../helpers/transition-table';
import { PHASES, RUN_EVENTS, RUN_LEGAL, STATUSES } from '../helpers/run-table';

const STATES: SandboxState[] = ['created', 'running', 'stopped', 'paused', 'suspended', 'destroyed', 'failed', 'lost'];
const facts = (state: SandboxState, extra: Partial<Parameters<typeof decideSandboxOp>[0]> = {}) => ({
  state,
  changing: false,
  runningExecs: 0,
  fileOps: 0,
  expired: false,
  ...extra,
});

describe('sandbox transition table', () => {
  const cases = STATES.flatMap((state) => USER_OPS.map((op) => [state, op] as const));
  test.each(cases)('%s --%s-->', (state, op) => {
    const decision = decideSandboxOp(facts(state), op);
    const key = `${state}/${op}`;
    if (state === 'destroyed') {
      expect(decision).toEqual({ kind: 'reject', rejection: { code: 'NOT_FOUND', message: expect.any(String) } });
    } else if (IDEMPOTENT.has(key)) {
      expect(decision).toEqual({ kind: 'noop' });
    } else if (LEGAL[key]) {
      expect(decision).toEqual({ kind: 'transition', to: LEGAL[key] });
    } else {
      expect(decision).toEqual({
        kind: 'reject',
        rejection: { code: 'INVALID_STATE_TRANSITION', message: 'sandbox: invalid state transition' },
      });
    }
  });

  test('runtime failure and reconcile loss', () => {
    expect(decideSandboxOp(facts('running'), 'fail')).toEqual({ kind: 'transition', to: 'failed' });
    // Never provisioned: its provisioning failed for good.
    expect(decideSandboxOp(facts('created'), 'fail')).toEqual({ kind: 'transition', to: 'failed' });
    for (const state of ['stopped', 'paused', 'suspended', 'destroyed', 'failed', 'lost'] as const)
      expect(decideSandboxOp(facts(state), 'fail').kind).toBe('reject');
    expect(decideSandboxOp(facts('running'), 'lose')).toEqual({ kind: 'transition', to: 'lost' });
    expect(decideSandboxOp(facts('paused'), 'lose')).toEqual({ kind: 'transition', to: 'lost' });
    expect(decideSandboxOp(facts('suspended'), 'lose').kind).toBe('reject');
    expect(decideSandboxOp(facts('suspended'), 'unsuspend')).toEqual({ kind: 'transition', to: 'running' });
    expect(decideSandboxOp(facts('running'), 'unsuspend').kind).toBe('reject');
    expect(Object.keys(SANDBOX_TRANSITIONS).sort()).toEqual(
      [...USER_OPS, 'fail', 'lose', 'unsuspend'].sort() as SandboxOp[],
    );
  });

  test('a state change in progress makes a second one 409', () => {
    expect(decideSandboxOp(facts('running', { changing: true }), 'stop')).toMatchObject({
      kind: 'reject',
      rejection: { code: 'INVALID_STATE_TRANSITION' },
    });
  });

  test('suspend refuses while a command runs; exec refuses once a suspend is admitted', () => {
    expect(decideSandboxOp(facts('running', { runningExecs: 1 }), 'suspend')).toMatchObject({
      kind: 'reject',
      rejection: { code: 'SANDBOX_SUSPEND_BUSY' },
    });
    expect(decideSandboxOp(facts('running', { fileOps: 1 }), 'suspend')).toMatchObject({
      kind: 'reject',
      rejection: { code: 'SANDBOX_SUSPEND_BUSY' },
    });
    // Only suspend waits for file operations: stop, pause and destroy do not touch the files.
    for (const op of ['stop', 'pause', 'destroy'] as const) {
      expect(decideSandboxOp(facts('running', { fileOps: 1 }), op).kind).toBe('transition');
    }
    expect(decideFileAccess(facts('running', { changing: true }))?.code).toBe('INVALID_STATE_TRANSITION');
    expect(decideExec(facts('running', { changing: true }))?.code).toBe('INVALID_STATE_TRANSITION');
    expect(decideExec(facts('running'))).toBeUndefined();
    expect(decideExec(facts('paused'))?.code).toBe('INVALID_STATE_TRANSITION');
    expect(decideExec(facts('destroyed'))?.code).toBe('NOT_FOUND');
  });

  test('after retention expiry every call but destroy is a stale route', () => {
    for (const op of ['start', 'stop', 'pause', 'resume', 'suspend'] as const) {
      expect(decideSandboxOp(facts('suspended', { expired: true }), op)).toMatchObject({
        kind: 'reject',
        rejection: { code: 'STALE_SANDBOX_ROUTE' },
      });
    }
    expect(decideSandboxOp(facts('suspended', { expired: true }), 'destroy')).toEqual({
      kind: 'transition',
      to: 'destroyed',
    });
    expect(decideExec(facts('suspended', { expired: true }))?.code).toBe('STALE_SANDBOX_ROUTE');
    expect(decideFileAccess(facts('suspended', { expired: true }))?.code).toBe('STALE_SANDBOX_ROUTE');
  });

  test('files are reachable unless suspended, lost or destroyed', () => {
    for (const state of ['created', 'running', 'stopped', 'paused', 'failed'] as const)
      expect(decideFileAccess(facts(state))).toBeUndefined();
    expect(decideFileAccess(facts('suspended'))?.code).toBe('INVALID_STATE_TRANSITION');
    expect(decideFileAccess(facts('destroyed'))?.code).toBe('NOT_FOUND');
  });
});

describe('history room of a sandbox', () => {
  const CALLS: SandboxCall[] = ['ready', 'exec', 'readFile', 'writeFile', ...USER_OPS];
  const LARGE: SandboxCall[] = ['exec', 'readFile', 'writeFile'];
  /**
   * Taken whatever the history: what ends the commands or release that keep continue-as-new waiting,
   * each once before the state refuses the next.
   */
  const ALWAYS = (call: SandboxCall, state: SandboxState) =>
    call === 'stop' || call === 'destroy' || (call === 'resume' && state === 'suspended');
  const roomy = { continueAsNewSuggested: false, historySizeBytes: 1_000, historyLength: 10, callsUnderWay: 0 };
  const suggested = { ...roomy, continueAsNewSuggested: true };
  const pastGuard = { ...roomy, historySizeBytes: HISTORY_GUARD_BYTES };
  const pastEvents = { ...roomy, historyLength: HISTORY_LENGTH_HIGH_WATER };
  /** No room for one more large call, nothing under way: 35 MiB and a byte. */
  const noRoom = { ...roomy, historySizeBytes: HISTORY_GUARD_BYTES - CALL_HISTORY_MAX_BYTES + 1 };

  test('the guard and the calls under way it keeps room for stay well under the 50 MiB and 51,200 events at which Temporal terminates a workflow', () => {
    expect(HISTORY_GUARD_BYTES).toBeLessThanOrEqual(40 * 1024 * 1024);
    expect(HISTORY_LENGTH_HIGH_WATER).toBeLessThanOrEqual(40_000);
  });

  test.each(STATES.flatMap((state) => CALLS.map((call) => [state, call] as const)))('%s: %s', (state, call) => {
    // Temporal's suggestion alone refuses nothing: a long command would lock every call out at 4 MiB.
    expect(decideHistoryRoom(roomy, call, state)).toBeUndefined();
    expect(decideHistoryRoom(suggested, call, state)).toBeUndefined();
    for (const history of [pastGuard, pastEvents, { ...pastGuard, continueAsNewSuggested: true }]) {
      const rejection = decideHistoryRoom(history, call, state);
      if (ALWAYS(call, state)) expect(rejection).toBeUndefined();
      else
        expect(rejection).toEqual({
          code: 'UNAVAILABLE',
          message: expect.stringMatching(new RegExp(`^sandbox: ${call} not taken now: its history is full .*; retry$`)),
        });
    }
    // With no room for one more large call, only large calls wait; continue-as-new is then due.
    expect(decideHistoryRoom(noRoom, call, state) === undefined).toBe(ALWAYS(call, state) || !LARGE.includes(call));
  });

  test('calls sent all at once: those taken can never together take the history past the guard, and as many as fit are taken', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: HISTORY_GUARD_BYTES }),
        fc.boolean(),
        fc.array(fc.constantFrom<SandboxCall>('exec', 'readFile', 'writeFile'), { maxLength: 40 }),
        (size, suggestedNow, flood) => {
          let underWay = 0;
          for (const call of flood) {
            const history = {
              continueAsNewSuggested: suggestedNow,
              historySizeBytes: size,
              historyLength: 100,
              callsUnderWay: underWay,
            };
            const rejection = decideHistoryRoom(history, call, 'running');
            if (rejection === undefined) underWay += 1;
            else expect(rejection.code).toBe('UNAVAILABLE');
          }
          expect(size + underWay * CALL_HISTORY_MAX_BYTES).toBeLessThanOrEqual(HISTORY_GUARD_BYTES);
          if (flood.length > underWay) {
            expect(size + (underWay + 1) * CALL_HISTORY_MAX_BYTES).toBeGreaterThan(HISTORY_GUARD_BYTES);
          }
        },
      ),
    );
  });

  test('a quiet sandbox never refuses a large call for good: wherever there is no room for one, continue-as-new is due', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 * HISTORY_GUARD_BYTES }), fc.nat({ max: 60_000 }), (size, length) => {
        const quiet = {
          continueAsNewSuggested: false,
          historySizeBytes: size,
          historyLength: length,
          callsUnderWay: 0,
        };
        if (decideHistoryRoom(quiet, 'exec', 'running') !== undefined) expect(continueAsNewDue(quiet)).toBe(true);
      }),
    );
  });

  test('a small history takes several calls at once; stop and destroy are taken however many are under way', () => {
    const busy = { ...roomy, callsUnderWay: 7 }; // 8 × 5 MiB are 40 MiB: seven at most
    expect(decideHistoryRoom({ ...busy, callsUnderWay: 6 }, 'exec', 'running')).toBeUndefined();
    expect(decideHistoryRoom(busy, 'exec', 'running')?.message).toMatch(
      /^sandbox: exec not taken now: its history keeps room for the 7 commands and file operations under way, and none for more; .*; retry$/,
    );
    expect(decideHistoryRoom({ ...busy, callsUnderWay: 100 }, 'stop', 'running')).toBeUndefined();
    expect(decideHistoryRoom({ ...busy, callsUnderWay: 100 }, 'destroy', 'running')).toBeUndefined();
    expect(decideHistoryRoom({ ...busy, callsUnderWay: 100 }, 'pause', 'running')).toBeUndefined();
  });

  test('continue-as-new is due at the suggestion, with no room for one more call, or past the events mark', () => {
    expect(continueAsNewDue(roomy)).toBe(false);
    expect(continueAsNewDue(suggested)).toBe(true);
    expect(continueAsNewDue(noRoom)).toBe(true);
    expect(continueAsNewDue({ ...noRoom, historySizeBytes: noRoom.historySizeBytes - 1 })).toBe(false);
    expect(continueAsNewDue(pastGuard)).toBe(true);
    expect(continueAsNewDue(pastEvents)).toBe(true);
  });
});

describe('pause mode choice', () => {
  const all = ['DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'] as const;
  test.each([
    ['INTERACTION', 'isolated', undefined, [...all], { kind: 'release', mode: 'SNAPSHOT_AND_TERMINATE' }],
    ['INTERACTION', 'active', undefined, [...all], { kind: 'release', mode: 'TERMINATE' }],
    ['POLICY_HOLD', 'isolated', undefined, [...all], { kind: 'release', mode: 'DETACH' }],
    ['POLICY_HOLD', 'active', 'auto', [...all], { kind: 'release', mode: 'DETACH' }],
    ['MANUAL', 'isolated', 'DETACH', [...all], { kind: 'release', mode: 'DETACH' }],
    // Terminating an isolated workspace without a snapshot would lose it.
    ['INTERACTION', 'isolated', 'TERMINATE', [...all], { kind: 'release', mode: 'SNAPSHOT_AND_TERMINATE' }],
    [
      'INTERACTION',
      'isolated',
      undefined,
      ['DETACH', 'TERMINATE'],
      { kind: 'retain', wanted: 'SNAPSHOT_AND_TERMINATE' },
    ],
    ['POLICY_HOLD', 'isolated', undefined, [], { kind: 'retain', wanted: 'DETACH' }],
    ['INTERACTION', 'active', undefined, ['SNAPSHOT_AND_TERMINATE'], { kind: 'retain', wanted: 'TERMINATE' }],
  ] as const)(
    '%s on %s workspace (policy %s, advertised %j)',
    (reason, workspace, policyPauseMode, advertised, expected) => {
      const decision = choosePauseMode({
        reason,
        workspace,
        ...(policyPauseMode ? { policyPauseMode } : {}),
        advertised: [...advertised],
      });
      expect(decision).toMatchObject(expected);
    },
  );
});

describe('release blocking', () => {
  const job = (over: Partial<JobState>): JobState => ({
    id: 'j',
    command: 'x',
    pauseBehavior: 'CANCEL',
    executionAffinity: 'SANDBOX',
    status: 'running',
    ...over,
  });
  test.each([
    [job({ pauseBehavior: 'CONTINUE' }), true, false],
    [job({ pauseBehavior: 'DETACH' }), true, false],
    [job({ pauseBehavior: 'CANCEL' }), false, true],
    [job({ pauseBehavior: 'CONTINUE', executionAffinity: 'EXTERNAL' }), false, false],
    [job({ pauseBehavior: 'CANCEL', executionAffinity: 'EXTERNAL' }), false, false],
    [job({ pauseBehavior: 'CONTINUE', status: 'succeeded' }), false, false],
  ])('%j blocks=%s cancels=%s', (j, blocks, cancels) => {
    expect(blockingJobs([j]).length > 0).toBe(blocks);
    expect(jobsToCancel([j]).length > 0).toBe(cancels);
    expect(isReleaseBlocked([j], [])).toBe(blocks);
  });

  test('a parent is blocked while any child record is not released', () => {
    expect(
      blockingChildren([
        { runId: 'a', state: 'RELEASED' },
        { runId: 'b', state: 'RELEASING' },
      ]),
    ).toEqual(['b']);
    expect(
      isReleaseBlocked(
        [],
        [
          { runId: 'a', state: 'RELEASED' },
          { runId: 'b', state: 'DESTROYED' },
        ],
      ),
    ).toBe(false);
    expect(isReleaseBlocked([], [{ runId: 'a', state: 'ACTIVE' }])).toBe(true);
  });

  test.each([
    // [child record, child's reported status, blocks with statuses, blocks without]
    ['ACTIVE', 'RUNNING', true, true],
    ['ACTIVE', 'WAITING', true, true],
    ['RELEASE_BLOCKED', 'RUNNING', true, true],
    ['ACTIVE', 'CANCELLED', false, true],
    ['ACTIVE', 'FAILED', false, true],
    ['RETAINED', 'CANCELLED', false, true],
    ['RETAINED', 'COMPLETED', false, true],
    ['RELEASING', 'EXPIRED', false, true],
    ['RELEASED', 'RUNNING', false, false],
    ['DESTROYED', 'COMPLETED', false, false],
    ['ACTIVE', undefined, true, true],
  ] as const)(
    'a child whose record is %s and Run %s: blocks %s (%s without its status)',
    (state, status, withStatus, without) => {
      const children = [{ runId: 'c', state }];
      const statuses: Record<string, RunStatus> = status ? { c: status } : {};
      expect(blockingChildren(children, statuses).length > 0).toBe(withStatus);
      expect(isReleaseBlocked([], children, statuses)).toBe(withStatus);
      expect(blockingChildren(children).length > 0).toBe(without);
    },
  );
});

describe('receipts, retries and keys', () => {
  const checkpoint = { uri: 's3://b/checkpoints/sbx/3-x.tar.gz', sha256: 'a'.repeat(64), bytes: 10 };
  const request = (mode: PauseMode) => ({ sandboxId: 'sbx', idempotencyKey: 'run-1/sbx/3/release', mode, fence: 3 });
  const answer = (mode: PauseMode, extra: Partial<ReleaseReceiptFacts> = {}): ReleaseReceiptFacts => ({
    ...request(mode),
    computeReleased: mode !== 'DETACH',
    ...(mode === 'SNAPSHOT_AND_TERMINATE' ? { checkpoint } : {}),
    ...extra,
  });

  test.each([
    ['TERMINATE', {}, undefined],
    ['TERMINATE', { computeReleased: false }, 'computeReleased=false'],
    ['SNAPSHOT_AND_TERMINATE', {}, undefined],
    ['SNAPSHOT_AND_TERMINATE', { computeReleased: false }, 'computeReleased=false'],
    ['SNAPSHOT_AND_TERMINATE', { checkpoint: undefined }, 'no checkpoint'],
    ['DETACH', {}, undefined],
    ['DETACH', { computeReleased: true }, undefined],
    ['TERMINATE', { mode: 'DETACH' }, 'mode'],
    ['SNAPSHOT_AND_TERMINATE', { mode: 'TERMINATE' }, 'mode'],
    ['SNAPSHOT_AND_TERMINATE', { sandboxId: 'other' }, 'sandboxId'],
    ['TERMINATE', { idempotencyKey: 'run-1/sbx/2/release' }, 'idempotencyKey'],
    ['SNAPSHOT_AND_TERMINATE', { fence: 2 }, 'fence'],
    ['DETACH', { fence: 4 }, 'fence'],
    ['DETACH', { sandboxId: 'other' }, 'sandboxId'],
  ] as const)('%s answered with %j: problem %s', (mode, extra, problem) => {
    const found = receiptProblem(request(mode), answer(mode, extra as Partial<ReleaseReceiptFacts>));
    if (problem === undefined) expect(found).toBeUndefined();
    else expect(found).toContain(problem);
  });

  test('no receipt confirms a request it does not answer (any field off)', () => {
    fc.assert(
      fc.property(
        fc.constantFrom<PauseMode>('DETACH', 'TERMINATE', 'SNAPSHOT_AND_TERMINATE'),
        fc.constantFrom('sandboxId', 'idempotencyKey', 'fence', 'mode'),
        (mode, field) => {
          const wrong = {
            sandboxId: 'x',
            idempotencyKey: 'k',
            fence: 9,
            mode: mode === 'DETACH' ? 'TERMINATE' : 'DETACH',
          }[field];
          expect(receiptProblem(request(mode), answer(mode, { [field]: wrong }))).toContain(field);
        },
      ),
    );
  });

  test('backoff doubles from 1 s and stops at 5 min', () => {
    expect([1, 2, 3, 4, 5, 10, 50].map(releaseBackoffMs)).toEqual([0, 1_000, 2_000, 4_000, 8_000, 256_000, 300_000]);
  });

  test("a parent's pings of unwatched children back off from 30 s, doubling, to 1 h", () => {
    expect([0, 1, 2, 6, 7, 20, 1000].map(childPingDelayMs)).toEqual([
      30_000, 60_000, 120_000, 1_920_000, 3_600_000, 3_600_000, 3_600_000,
    ]);
  });

  test('idempotency key names run, sandbox and fence', () => {
    expect(releaseIdempotencyKey('run-1', 'sbx', 3)).toBe('run-1/sbx/3/release');
  });
});

describe('resume plan', () => {
  const record = { sandboxId: 's', provider: 'local', hostId: 'h1', fence: 2, attempts: 0 };
  test.each([
    ['RETAINED', undefined, 'attach'],
    ['RELEASING', 'SNAPSHOT_AND_TERMINATE', 'attach'],
    ['RELEASE_BLOCKED', 'TERMINATE', 'attach'],
    ['RELEASED', 'DETACH', 'attach'],
    ['RELEASED', 'TERMINATE', 'reprovision'],
    ['RELEASED', 'SNAPSHOT_AND_TERMINATE', 'restore'],
    ['DESTROYING', undefined, 'none'],
    ['DESTROYED', undefined, 'none'],
  ] as const)('%s (%s) → %s', (state, pauseMode, kind) => {
    expect(planResume({ ...record, state, ...(pauseMode ? { pauseMode } : {}) }).kind).toBe(kind);
  });

  // An answered Run's resume travels with its next action only when that is a sandbox job it waits for.
  test.each([
    [{ type: 'job', executionAffinity: 'SANDBOX', background: false }, true],
    [{ type: 'job', executionAffinity: 'SANDBOX' }, true],
    [{ type: 'job', executionAffinity: 'SANDBOX', background: true }, false],
    [{ type: 'job', executionAffinity: 'EXTERNAL', background: false }, false],
    [{ type: 'readFile' }, false],
    [{ type: 'writeFile' }, false],
    [{ type: 'interaction' }, false],
    [{ type: 'hold' }, false],
    [{ type: 'spawn' }, false],
    [{ type: 'complete' }, false],
    [{ type: 'fail' }, false],
  ] as const)('resume fused with %j: %s', (action, fused) => {
    expect(fusesWithResume(action)).toBe(fused);
  });

  // A deferred resume is skipped only if the next suspension would release the sandbox as it already is.
  test.each([
    ['RELEASED', 'SNAPSHOT_AND_TERMINATE', { kind: 'release', mode: 'SNAPSHOT_AND_TERMINATE' }, true],
    ['RELEASED', 'DETACH', { kind: 'release', mode: 'DETACH' }, true],
    ['RELEASED', 'TERMINATE', { kind: 'release', mode: 'TERMINATE' }, true],
    ['RELEASED', 'SNAPSHOT_AND_TERMINATE', { kind: 'release', mode: 'DETACH' }, false],
    ['RELEASED', 'DETACH', { kind: 'release', mode: 'SNAPSHOT_AND_TERMINATE' }, false],
    ['RELEASED', undefined, { kind: 'release', mode: 'DETACH' }, false],
    ['RELEASED', 'DETACH', { kind: 'retain', wanted: 'DETACH', why: 'not advertised' }, false],
    // Not (fully) released: the compute still runs, so the next suspension releases it itself.
    ['ACTIVE', 'DETACH', { kind: 'release', mode: 'DETACH' }, false],
    ['RETAINED', 'DETACH', { kind: 'release', mode: 'DETACH' }, false],
    ['RELEASE_BLOCKED', 'DETACH', { kind: 'release', mode: 'DETACH' }, false],
    ['RELEASING', 'DETACH', { kind: 'release', mode: 'DETACH' }, false],
    ['DESTROYED', 'DETACH', { kind: 'release', mode: 'DETACH' }, false],
  ] as const)('resume skipped from %s (released in %s) into %j: %s', (before, mode, decision, stays) => {
    expect(staysReleased(before, mode, decision)).toBe(stays);
  });

  test('hash mismatch names what changed', () => {
    const now = { run: 'r', spec: 's', policy: 'p' };
    expect(hashMismatches(now, now, { run: 'r' })).toEqual([]);
    expect(hashMismatches(now, { run: 'r', spec: 'x', policy: 'p' }, { policy: 'y' })).toEqual(['spec', 'policy']);
    expect(hashMismatches(now, undefined)).toEqual([]);
  });
});

describe("a Run's end", () => {
  // What the end of a cancelled or failed Run does first with a sandbox it finds mid-change, by record state.
  const table = [
    ['PROVISIONING', 'destroy'],
    ['ACTIVE', undefined],
    ['RELEASING', undefined],
    ['RELEASE_BLOCKED', undefined],
    ['RETAINED', undefined],
    ['RELEASED', undefined],
    ['RESTORING', 'finishResume'],
    ['DESTROYING', undefined],
    ['DESTROYED', undefined],
  ] as const;
  test.each(table)('%s → %s', (state, first) => {
    expect(settleAtEnd(state)).toBe(first);
  });

  test('the table covers every record state', () => {
    expect(new Set(table.map(([state]) => state))).toEqual(new Set(RESOURCE_STATES));
  });
});

describe('destroy', () => {
  // Every record state a destroy can meet: it says DESTROYING while it waits, unless it already does (or is done).
  test.each([
    ['PROVISIONING', 'DESTROYING'],
    ['ACTIVE', 'DESTROYING'],
    ['RELEASING', 'DESTROYING'],
    ['RELEASE_BLOCKED', 'DESTROYING'],
    ['RETAINED', 'DESTROYING'],
    ['RELEASED', 'DESTROYING'],
    ['RESTORING', 'DESTROYING'],
    ['DESTROYING', undefined],
    ['DESTROYED', undefined],
  ] as const)('%s → %s', (state, next) => {
    expect(destroyingState(state)).toBe(next);
  });

  test('the table covers every record state', () => {
    expect(new Set(RESOURCE_STATES)).toEqual(new Set([...DESTROYABLE, 'DESTROYING', 'DESTROYED']));
  });
});

describe('respond checks', () => {
  const pending = { id: 'int-1', kind: 'approval' as const, prompt: 'ok?', createdAt: 't', status: 'pending' as const };
  const answered = { ...pending, status: 'answered' as const, response: { decision: 'approve' } };
  const run = (over: Partial<Parameters<typeof checkRespond>[0]> = {}) => ({
    status: 'WAITING' as const,
    interactions: [pending],
    answeredBy: {},
    ...over,
  });
  test('accepts a pending approval', () => {
    expect(checkRespond(run(), { interactionId: 'int-1', response: { decision: 'approve' } }, 'u1')).toBeUndefined();
  });
  test('unknown interaction', () => {
    expect(checkRespond(run(), { interactionId: 'nope', response: { decision: 'approve' } }, 'u1')).toMatchObject({
      code: 'NOT_FOUND',
    });
  });
  test('already answered, unless identical under the same update id', () => {
    const r = run({ status: 'RUNNING', interactions: [answered], answeredBy: { 'int-1': { updateId: 'u1' } } });
    expect(checkRespond(r, { interactionId: 'int-1', response: { decision: 'approve' } }, 'u1')).toBe('duplicate');
    expect(checkRespond(r, { interactionId: 'int-1', response: { decision: 'approve' } }, 'u2')).toMatchObject({
      code: 'ALREADY_ANSWERED',
    });
    expect(checkRespond(r, { interactionId: 'int-1', response: { decision: 'deny' } }, 'u1')).toMatchObject({
      code: 'ALREADY_ANSWERED',
    });
    expect(checkRespond(r, { interactionId: 'int-1', response: { decision: 'approve' } }, undefined)).toMatchObject({
      code: 'ALREADY_ANSWERED',
    });
  });
  test('payload kind must match the interaction', () => {
    expect(checkRespond(run(), { interactionId: 'int-1', response: { input: 'x' } }, 'u')).toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
    const input = { ...pending, kind: 'input' as const };
    expect(
      checkRespond(run({ interactions: [input] }), { interactionId: 'int-1', response: { decision: 'approve' } }, 'u'),
    ).toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
  });
  test('an expired Run is a stale route', () => {
    expect(
      checkRespond(run({ status: 'EXPIRED' }), { interactionId: 'int-1', response: { decision: 'approve' } }, 'u'),
    ).toMatchObject({
      code: 'STALE_SANDBOX_ROUTE',
    });
  });
});

describe('update arguments', () => {
  test.each([
    ['stop', [], 0, undefined],
    ['stop', [{ junk: 1 }], 0, 'stop: takes no arguments, got 1'],
    ['stop', [undefined], 0, 'stop: takes no arguments, got 1'],
    ['exec', [{ command: 'true' }], 1, undefined],
    ['exec', [], 1, 'exec: takes one argument, got 0'],
    ['respond', [{ interactionId: 'int-1' }, 'extra'], 1, 'respond: takes one argument, got 2'],
  ] as const)('%s with %j (expects %i) → %s', (update, args, expected, message) => {
    const rejection = checkArity(update, args, expected);
    expect(rejection).toEqual(message === undefined ? undefined : { code: 'INVALID_ARGUMENT', message });
  });
});

describe('run state machine', () => {
  const states = STATUSES.flatMap((status) => PHASES.map((phase) => ({ status, phase })));
  test.each(states.flatMap((s) => RUN_EVENTS.map((event) => [s.status, s.phase, event] as const)))(
    '%s/%s --%s-->',
    (status, phase, event) => {
      const next = nextRunState({ status, phase }, event);
      const expected = RUN_LEGAL[`${status}/${phase}/${event}`];
      if (expected) expect(`${(next as RunState).status}/${(next as RunState).phase}`).toBe(expected);
      else
        expect(next).toEqual({
          code: 'INVALID_STATE_TRANSITION',
          message: `run: cannot ${event} while ${status}/${phase}`,
        });
    },
  );

  test('every state a transition reaches is in the status × phase table', () => {
    for (const s of states) {
      for (const event of RUN_EVENTS) {
        const next = nextRunState(s, event);
        if (!isRejection(next)) expect(RUN_STATES[next.status]).toContain(next.phase);
      }
    }
    expect(Object.keys(RUN_TRANSITIONS).sort()).toEqual([...RUN_EVENTS].sort());
  });

  const facts = (over: Partial<RunFacts> = {}): RunFacts => ({
    status: 'RUNNING',
    phase: 'ACTIVE',
    suspendRequested: false,
    expiring: false,
    runningJobs: 0,
    ...over,
  });
  test.each([
    ['suspend', facts(), undefined],
    ['suspend', facts({ suspendRequested: true }), 'INVALID_STATE_TRANSITION'],
    ['suspend', facts({ status: 'WAITING' }), 'INVALID_STATE_TRANSITION'],
    ['suspend', facts({ phase: 'SUSPENDED', suspensionReason: 'MANUAL' }), 'INVALID_STATE_TRANSITION'],
    ['suspend', facts({ status: 'COMPLETED' }), 'INVALID_STATE_TRANSITION'],
    ['suspend', facts({ status: 'EXPIRED' }), 'STALE_SANDBOX_ROUTE'],
    // RESUMING (deferred to the agent's next step, riding with its job, or restoring): taken after it.
    ['suspend', facts({ phase: 'RESUMING' }), undefined],
    ['suspend', facts({ phase: 'RESUMING', suspendRequested: true }), 'INVALID_STATE_TRANSITION'],
    ['suspend', facts({ status: 'WAITING', phase: 'RESUMING' }), 'INVALID_STATE_TRANSITION'],
    ['suspend', facts({ phase: 'SUSPENDING' }), 'INVALID_STATE_TRANSITION'],
    ['resume', facts({ phase: 'SUSPENDED', suspensionReason: 'MANUAL' }), undefined],
    ['resume', facts({ phase: 'SUSPENDED', suspensionReason: 'POLICY_HOLD' }), undefined],
    [
      'resume',
      facts({ status: 'WAITING', phase: 'SUSPENDED', suspensionReason: 'INTERACTION' }),
      'INVALID_STATE_TRANSITION',
    ],
    ['resume', facts({ phase: 'SUSPENDING', suspensionReason: 'MANUAL' }), 'INVALID_STATE_TRANSITION'],
    ['resume', facts(), 'INVALID_STATE_TRANSITION'],
    ['resume', facts({ phase: 'SUSPENDED', suspensionReason: 'MANUAL', expiring: true }), 'STALE_SANDBOX_ROUTE'],
    ['cancel', facts({ phase: 'RESUMING' }), undefined],
    ['cancel', facts({ status: 'FAILED' }), 'INVALID_STATE_TRANSITION'],
    ['continueAsNew', facts(), undefined],
    ['continueAsNew', facts({ runningJobs: 1 }), 'INVALID_STATE_TRANSITION'],
    ['continueAsNew', facts({ phase: 'SUSPENDED', suspensionReason: 'MANUAL' }), 'INVALID_STATE_TRANSITION'],
  ] as const)('%s admitted on %j → %s', (op, f, code) => {
    expect(admitRunOp(f, op)?.code).toBe(code);
  });

  // Backpressure: a Run whose history, with RUN_ITEM_HISTORY_MAX_BYTES of room for each running job and
  // child, reaches the high-water mark (or past the events' mark with one running) takes no step.
  const MiB = 1024 * 1024;
  const ROOM = RUN_ITEM_HISTORY_MAX_BYTES;
  const run = (historySize: number, runningJobs: number, runningChildren = 0, historyLength = 10): RunHistoryFacts => ({
    historySize,
    historyLength,
    runningJobs,
    runningChildren,
  });
  test.each([
    [run(0, 1), false],
    [run(0, 0, 1), false],
    [run(HISTORY_SIZE_HIGH_WATER_BYTES - 3 * ROOM - 1, 3), false],
    [run(HISTORY_SIZE_HIGH_WATER_BYTES - 3 * ROOM, 3), true],
    [run(HISTORY_SIZE_HIGH_WATER_BYTES - 3 * ROOM, 1, 2), true],
    [run(HISTORY_SIZE_HIGH_WATER_BYTES - 3 * ROOM, 0, 3), true],
    [run(HISTORY_SIZE_HIGH_WATER_BYTES - 3 * ROOM, 0, 2), false],
    // Sixteen items from an empty history: the room alone reaches the mark.
    [run(100_000, 8, 8), true],
    [run(100_000, 8, 7), false],
    [run(HISTORY_SIZE_HIGH_WATER_BYTES, 1), true],
    [run(49 * MiB, 2), true],
    [run(1 * MiB, 1, 0, HISTORY_LENGTH_HIGH_WATER), true],
    [run(1 * MiB, 0, 1, HISTORY_LENGTH_HIGH_WATER), true],
    [run(1 * MiB, 1, 0, HISTORY_LENGTH_HIGH_WATER - 1), false],
    // Nothing running: the Run takes its step, or continues as new.
    [run(49 * MiB, 0, 0, 50_000), false],
  ] satisfies [RunHistoryFacts, boolean][])('waitsForJobs(%j) → %s', (f, waits) => {
    expect(waitsForJobs(f)).toBe(waits);
  });

  test('whatever the order jobs and children start and end, what they take never passes the mark by more than one step', () => {
    // The most one step adds to the history (a foreground exec's result, once more in the next step's input).
    const STEP_MAX = 3 * MiB;
    // Temporal suggests continue-as-new from here; a Run with nothing running takes it.
    const SUGGESTED = 4 * MiB;
    type Event =
      | { kind: 'step'; bytes: number; starts: 'job' | 'child' | 'nothing' }
      | { kind: 'end'; which: number; bytes: number };
    const event: fc.Arbitrary<Event> = fc.oneof(
      fc.record({
        kind: fc.constant('step' as const),
        bytes: fc.integer({ min: 0, max: STEP_MAX }),
        starts: fc.constantFrom('job' as const, 'child' as const, 'nothing' as const),
      }),
      fc.record({ kind: fc.constant('end' as const), which: fc.nat(), bytes: fc.integer({ min: 0, max: ROOM }) }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 40 * MiB }), fc.array(event, { maxLength: 200 }), (start, events) => {
        let historySize = start;
        const running: ('job' | 'child')[] = [];
        const facts = (): RunHistoryFacts => ({
          historySize,
          historyLength: 10,
          runningJobs: running.filter((r) => r === 'job').length,
          runningChildren: running.filter((r) => r === 'child').length,
        });
        const taken = () => historySize + running.length * ROOM;
        const bound = Math.max(start, HISTORY_SIZE_HIGH_WATER_BYTES) + STEP_MAX + ROOM;
        for (const e of events) {
          if (e.kind === 'end') {
            if (running.length === 0) continue;
            running.splice(e.which % running.length, 1);
            historySize += e.bytes;
          } else {
            if (waitsForJobs(facts())) continue;
            if (running.length === 0 && historySize >= SUGGESTED) historySize = 100_000; // continues as new
            historySize += e.bytes;
            if (e.starts !== 'nothing') running.push(e.starts);
          }
          expect(taken()).toBeLessThan(bound);
        }
        // Once every job and child has ended, the Run never waits: nothing is held for good.
        expect(waitsForJobs({ ...facts(), runningJobs: 0, runningChildren: 0 })).toBe(false);
        expect(historySize + running.length * ROOM).toBeLessThan(50 * MiB);
      }),
    );
  });

  test('what one job or child may add covers a 2 MiB payload, and sixteen fit under the mark', () => {
    expect(RUN_ITEM_HISTORY_MAX_BYTES).toBeGreaterThanOrEqual(2 * MiB);
    expect(HISTORY_SIZE_HIGH_WATER_BYTES + 3 * MiB + RUN_ITEM_HISTORY_MAX_BYTES).toBeLessThan(50 * MiB - 8 * MiB);
  });

  test("the high-water marks leave room under Temporal's limits (50 MiB, 51,200 events)", () => {
    expect(HISTORY_SIZE_HIGH_WATER_BYTES).toBeLessThanOrEqual(50 * MiB - 16 * MiB);
    expect(HISTORY_LENGTH_HIGH_WATER).toBeLessThanOrEqual(51_200 - 10_000);
  });

  test('once expiry begins, answers are a stale route', () => {
    const pending = {
      id: 'int-1',
      kind: 'approval' as const,
      prompt: 'ok?',
      createdAt: 't',
      status: 'pending' as const,
    };
    const run = { status: 'WAITING' as const, interactions: [pending], answeredBy: {}, expiring: true };
    expect(checkRespond(run, { interactionId: 'int-1', response: { decision: 'approve' } }, 'u')).toMatchObject({
      code: 'STALE_SANDBOX_ROUTE',
    });
  });
});
