import fc from 'fast-check';
import { EXEC_OUTPUT_LIMIT_BYTES, execActivityResult, keepTail } from '../../activities/exec-output';
import type { InteractionRequest, RunSnapshot, RunSpec } from '../../common/schemas';
import { pendingMemo, withoutLabels, withRunLabels } from '../../common/interactions';
import { jsonBytes } from '../../common/payload-limits';
import type { ActionEntry } from '../../workflows/run-external';
import {
  CARRIED_INPUT_MAX_BYTES,
  CARRIED_INTERACTIONS,
  carriedAggregate,
  fitContinueInput,
  fitSnapshot,
  fitPendingMemo,
  fitSnapshotResult,
  forgetContent,
  PENDING_MEMO_MAX_BYTES,
  SNAPSHOT_QUERY_MAX_BYTES,
  toSnapshot,
  type ContinueInput,
  FORGOTTEN_PROMPT_CHARS,
  SETTLED_WHOLE_BYTES,
  shownInteractions,
  takeUp,
  type CarriedAggregate,
  type SessionAggregate,
} from '../../workflows/run-state';

describe('exec output keeps its tail', () => {
  test('output within the limit is unchanged', () => {
    fc.assert(fc.property(fc.string({ maxLength: 1000 }), (s) => expect(keepTail(s)).toBe(s)));
  });

  test('longer output keeps its last bytes, whole characters only, after a note saying how much went', () => {
    fc.assert(
      fc.property(
        fc.string({ unit: 'grapheme', minLength: 1, maxLength: 50 }),
        fc.integer({ min: 1, max: 64 }),
        (s, limit) => {
          const out = keepTail(s, limit);
          if (Buffer.byteLength(s) <= limit) return expect(out).toBe(s);
          const [note, ...rest] = out.split('\n');
          const tail = rest.join('\n');
          expect(note).toMatch(/^\[stasis: output truncated: the first \d+ bytes were dropped, the last \d+ kept\]$/);
          // A suffix of the text itself: no character cut in half (that would decode to U+FFFD, which the
          // text may hold of its own, so the suffix is what shows it).
          expect(s.endsWith(tail)).toBe(true);
          expect(Buffer.byteLength(tail)).toBeLessThanOrEqual(limit);
        },
      ),
      { numRuns: 300 },
    );
  });

  test("an exec activity's result: bounded streams, or none for a job whose output is thrown away (keepOutput false)", () => {
    const big = '\u0001'.repeat(EXEC_OUTPUT_LIMIT_BYTES + 10);
    const outcome = { exitCode: 3, stdout: big, stderr: 'err' };
    const kept = execActivityResult(outcome);
    expect(kept.exitCode).toBe(3);
    expect(kept.stdout).toBe(keepTail(big));
    expect(kept.stderr).toBe('err');
    expect(execActivityResult(outcome, false)).toEqual({ exitCode: 3, stdout: '', stderr: '' });
  });
});

describe('continue-as-new carries bounded state', () => {
  const aggregate = (interactions: number, jobs: number): SessionAggregate =>
    ({
      runId: 'r',
      interactions: Array.from({ length: interactions }, (_, i) => ({
        id: `int-${i + 1}`,
        kind: 'approval',
        prompt: 'p',
        createdAt: 't',
        status: i === interactions - 1 ? 'pending' : 'answered',
      })),
      answeredBy: Object.fromEntries(
        Array.from({ length: interactions - 1 }, (_, i) => [`int-${i + 1}`, { updateId: `u${i}` }]),
      ),
      jobs: Array.from({ length: jobs }, (_, i) => ({
        id: `job-${i}`,
        command: 'x',
        pauseBehavior: 'CANCEL',
        executionAffinity: 'SANDBOX',
        status: i % 2 ? 'running' : 'succeeded',
      })),
    }) as unknown as SessionAggregate;

  test('the newest settled interactions, every pending one, and running jobs only', () => {
    const carried = carriedAggregate(aggregate(500, 5_000));
    expect(carried.interactions).toHaveLength(CARRIED_INTERACTIONS + 1);
    expect(carried.interactions.at(-1)).toMatchObject({ id: 'int-500', status: 'pending' });
    expect(carried.interactions[0].id).toBe(`int-${500 - CARRIED_INTERACTIONS}`);
    expect(Object.keys(carried.answeredBy)).toHaveLength(CARRIED_INTERACTIONS);
    expect(carried.interactionCount).toBe(500);
    expect(carried.jobs.every((j) => j.status === 'running')).toBe(true);
    expect(carried.jobs).toHaveLength(2_500);
  });
});

describe('a Run shows and carries its settled interactions within a byte budget', () => {
  const bytes = (value: unknown) => Buffer.byteLength(JSON.stringify(value));
  const interaction = fc.record(
    {
      status: fc.constantFrom('pending', 'answered', 'answered', 'expired', 'cancelled'),
      prompt: fc.string({ unit: 'grapheme', maxLength: 3_000 }),
      details: fc.string({ maxLength: 20_000 }),
      command: fc.nat({ max: 200_000 }),
      answer: fc.oneof(
        fc.record({ decision: fc.constantFrom('approve', 'deny'), comment: fc.string({ maxLength: 50 }) }),
        fc.nat({ max: 200_000 }).map((n) => ({ input: '\u00e9'.repeat(n) })),
        fc.record({ decision: fc.constant('edit'), action: fc.record({ command: fc.string() }) }),
        fc.record({ option: fc.string({ minLength: 1, maxLength: 20 }) }),
      ),
    },
    { requiredKeys: ['status', 'prompt'] },
  );

  test('pending ones whole; the newest settled whole within the budget; older ones without their bulk', () => {
    fc.assert(
      fc.property(fc.array(interaction, { maxLength: 150 }), (drawn) => {
        const interactions = drawn.map(
          (d, i) =>
            ({
              id: `int-${i + 1}`,
              kind: 'approval',
              prompt: d.prompt,
              createdAt: 't',
              status: d.status,
              ...(d.details !== undefined ? { details: d.details } : {}),
              ...(d.command !== undefined ? { action: { command: 'c'.repeat(d.command) } } : {}),
              ...(d.status === 'answered' && d.answer ? { response: d.answer, respondedBy: 'alice' } : {}),
            }) as InteractionRequest,
        );
        const shown = shownInteractions(interactions);
        const settled = interactions.filter((i) => i.status !== 'pending');
        const kept = settled.slice(-CARRIED_INTERACTIONS).map((i) => i.id);
        // Order kept; every pending one, and the newest settled ones.
        expect(shown.map((i) => i.id)).toEqual(
          interactions.filter((i) => i.status === 'pending' || kept.includes(i.id)).map((i) => i.id),
        );
        const original = new Map(interactions.map((i) => [i.id, i]));
        let wholeBytes = 0;
        let forgottenSeen = false;
        for (const shownOne of [...shown].reverse()) {
          const before = original.get(shownOne.id)!;
          if (!shownOne.contentForgotten) {
            expect(shownOne).toBe(before);
            expect(forgottenSeen && shownOne.status !== 'pending').toBe(false);
            if (shownOne.status !== 'pending') wholeBytes += bytes(shownOne);
            continue;
          }
          forgottenSeen = true;
          expect(before.status).not.toBe('pending');
          expect(shownOne.action).toBeUndefined();
          expect(shownOne.details).toBeUndefined();
          expect(before.prompt.startsWith(shownOne.prompt)).toBe(true);
          expect(shownOne.prompt.length).toBeLessThanOrEqual(FORGOTTEN_PROMPT_CHARS);
          const answer = (before.response ?? {}) as Record<string, unknown>;
          if (before.response !== undefined)
            expect(shownOne.response).toEqual({
              ...(answer.decision !== undefined ? { decision: answer.decision } : {}),
              ...(answer.option !== undefined ? { option: answer.option } : {}),
            });
          expect(shownOne.respondedBy).toBe(before.respondedBy);
        }
        expect(wholeBytes).toBeLessThanOrEqual(SETTLED_WHOLE_BYTES);
        // A settled one is forgotten only when it would not have fit.
        const firstForgotten = shown.map((i) => i.contentForgotten === true).lastIndexOf(true);
        if (firstForgotten >= 0)
          expect(wholeBytes + bytes(interactions.find((i) => i.id === shown[firstForgotten].id))).toBeGreaterThan(
            SETTLED_WHOLE_BYTES,
          );
      }),
      { numRuns: 60 },
    );
  });

  test('continue-as-new carries the spec once (in its input), and the continued Run takes it up', () => {
    const run = { runId: 'r', spec: { agent: { driver: 'external' } }, interactions: [], answeredBy: {}, jobs: [] };
    const carried = carriedAggregate(run as unknown as SessionAggregate);
    expect('spec' in carried).toBe(false);
    expect(takeUp(carried, run.spec as unknown as RunSpec).spec).toBe(run.spec);
    // A Run continued by an earlier version carried its spec: that one is taken.
    const older = { ...carried, spec: { agent: { driver: 'scripted' } } } as unknown as CarriedAggregate;
    expect(takeUp(older, run.spec as unknown as RunSpec).spec).toBe(older.spec);
  });
});

describe("a Run's labels are kept once, in its spec", () => {
  const asked: InteractionRequest = {
    id: 'int-1',
    kind: 'approval',
    prompt: 'p',
    accepts: ['approve', 'deny'],
    createdAt: 't',
    status: 'pending',
  };
  const labels = { team: 'web', note: 'n'.repeat(10) };

  test('the surfaces show them where the copy was, byte for byte; none for a Run without labels', () => {
    const copied = {
      id: 'int-1',
      kind: 'approval',
      prompt: 'p',
      accepts: ['approve', 'deny'],
      labels,
      createdAt: 't',
      status: 'pending',
    };
    expect(JSON.stringify(withRunLabels(asked, labels))).toBe(JSON.stringify(copied));
    // An interaction asked before keeps its own copy; a Run without labels shows none.
    expect(withRunLabels(copied, { other: 'x' })).toBe(copied);
    expect(withRunLabels(asked, {})).toBe(asked);
    expect(withRunLabels(asked, undefined)).toBe(asked);
    expect(JSON.stringify(withoutLabels(copied))).toBe(JSON.stringify(asked));
  });

  test('the snapshot shows them on pending and recent interactions, none on forgotten ones; its size does not grow with them', () => {
    const big = { note: 'n'.repeat(900_000) };
    const interactions = Array.from({ length: 120 }, (_, i) => ({
      ...asked,
      id: `int-${i + 1}`,
      status: i === 119 ? 'pending' : 'answered',
      response: { decision: 'approve' },
    }));
    const run = { runId: 'r', status: 'WAITING', spec: { labels: big }, interactions, children: [] };
    const snapshot = toSnapshot(run as unknown as SessionAggregate);
    const shown = snapshot.interactions;
    expect(shown.at(-1)).toMatchObject({ id: 'int-120', status: 'pending', labels: big });
    expect(shown.slice(0, -1).every((i) => i.labels === undefined && i.contentForgotten)).toBe(true);
    expect(Buffer.byteLength(JSON.stringify(snapshot))).toBeLessThan(1_000_000);
    // Small labels: every interaction shows them, as when each carried a copy.
    const small = toSnapshot({ ...run, spec: { labels } } as unknown as SessionAggregate);
    expect(small.interactions.every((i) => i.labels === labels)).toBe(true);
    expect(forgetContent({ ...(asked as InteractionRequest), labels, status: 'answered' }).labels).toBeUndefined();
  });
});

describe('continue-as-new input is within CARRIED_INPUT_MAX_BYTES', () => {
  const bytes = (value: unknown) => Buffer.byteLength(JSON.stringify(value ?? null), 'utf8');
  const text = fc
    .tuple(fc.constantFrom('a', '€', '\u0001', '😀', '\uDC00'), fc.nat({ max: 120_000 }))
    .map(([c, n]) => c.repeat(n));
  const drawnInteraction = fc.record({
    settled: fc.boolean(),
    prompt: text,
    details: text,
    labelled: fc.boolean(),
  });
  const drawnAction = fc.record({ result: fc.option(text, { nil: undefined }), pending: fc.boolean() });

  /** A carried aggregate as a Run builds it (carriedAggregate over its state). */
  function inputOf(
    specLabels: string,
    drawn: { settled: boolean; prompt: string; details: string; labelled: boolean }[],
    actions: { result?: string; pending: boolean }[],
  ): ContinueInput {
    const labels = { note: specLabels };
    const interactions = drawn.map((d, i) => ({
      id: `int-${i + 1}`,
      kind: 'approval',
      prompt: d.prompt,
      details: d.details,
      ...(d.labelled ? { labels } : {}),
      createdAt: 't',
      status: d.settled || i < drawn.length - 1 ? 'answered' : 'pending',
      ...(d.settled || i < drawn.length - 1 ? { response: { decision: 'approve', comment: d.prompt } } : {}),
    })) as InteractionRequest[];
    const entries: ActionEntry[] = actions.map((a, i) =>
      a.pending && i === actions.length - 1
        ? {
            actionId: `a${i}`,
            type: 'writeFile',
            bodyHash: 'h',
            status: 'pending',
            action: { type: 'writeFile', path: 'f', content: a.result ?? '' },
          }
        : {
            actionId: `a${i}`,
            type: 'readFile',
            bodyHash: 'h',
            status: 'succeeded',
            ...(a.result !== undefined ? { result: { content: a.result } } : {}),
          },
    );
    const spec = { agent: { driver: 'external' }, sandbox: { provider: 'local' }, labels } as RunSpec;
    const run = {
      runId: 'r',
      spec,
      interactions,
      answeredBy: Object.fromEntries(interactions.map((i) => [i.id, { updateId: `u-${i.id}` }])),
      jobs: [],
      children: [],
      actions: entries,
    } as unknown as SessionAggregate;
    return { spec, carried: carriedAggregate(run) };
  }

  /** What cannot be forgotten: the input with every result, and every settled interaction, gone. */
  const minimum = (input: ContinueInput): ContinueInput => ({
    ...input,
    carried: {
      ...input.carried,
      interactions: input.carried.interactions.filter((i) => i.status === 'pending').map(withoutLabels),
      answeredBy: {},
      actions: (input.carried.actions ?? []).map(({ result: _r, resultBytes: _b, resultChars: _c, ...e }) =>
        e.status === 'pending' ? e : { ...e, resultForgotten: true as const },
      ),
    },
  });

  test('arbitrary labels, interactions and results: fitted within the bound, or fits=false only when the minimum is over it', () => {
    fc.assert(
      fc.property(
        text,
        fc.array(drawnInteraction, { maxLength: 12 }),
        fc.array(drawnAction, { maxLength: 12 }),
        fc.constantFrom(CARRIED_INPUT_MAX_BYTES, 256 * 1024, 64 * 1024),
        (labels, drawn, actions, max) => {
          const input = inputOf(labels, drawn, actions);
          const before = JSON.stringify(input);
          const { input: fitted, fits } = fitContinueInput(input, max);
          expect(JSON.stringify(input)).toBe(before); // pure
          if (fits) expect(bytes(fitted)).toBeLessThanOrEqual(max);
          else expect(bytes(minimum(input))).toBeGreaterThan(max);
          if (bytes(input) <= max) expect(fitted).toBe(input);
          // Never forgotten: the spec, pending interactions, every action entry (its id and outcome), a pending action's body.
          expect(fitted.spec).toBe(input.spec);
          const pendingIds = (c: ContinueInput) =>
            c.carried.interactions.filter((i) => i.status === 'pending').map((i) => i.id);
          expect(pendingIds(fitted)).toEqual(pendingIds(input));
          expect(fitted.carried.actions?.map((a) => [a.actionId, a.status, a.action])).toEqual(
            input.carried.actions?.map((a) => [a.actionId, a.status, a.action]),
          );
          // Forgetting goes oldest first: a kept result is never older than a forgotten one.
          const forgotten = (fitted.carried.actions ?? []).map((a) => a.resultForgotten === true);
          const lastForgotten = forgotten.lastIndexOf(true);
          if (lastForgotten >= 0) {
            expect((fitted.carried.actions ?? []).slice(0, lastForgotten).every((a) => a.result === undefined)).toBe(
              true,
            );
          }
          // Results go last: one is forgotten only once no settled interaction is left to forget.
          if (forgotten.some((f, i) => f && input.carried.actions?.[i].result !== undefined)) {
            expect(fitted.carried.interactions.filter((i) => i.status !== 'pending')).toEqual([]);
          }
          // answeredBy only for interactions still carried.
          const ids = new Set(fitted.carried.interactions.map((i) => i.id));
          expect(Object.keys(fitted.carried.answeredBy).every((id) => ids.has(id))).toBe(true);
        },
      ),
      { numRuns: 50 },
    );
  });

  test('labels of 900 KB copied into interactions, and results of "€": within the bound, labels once', () => {
    const labels = 'n'.repeat(900_000);
    const input = inputOf(
      labels,
      Array.from({ length: 4 }, () => ({ settled: true, prompt: 'p', details: '', labelled: true })),
      [
        { result: '€'.repeat(256_000), pending: false },
        { result: '€'.repeat(256_000), pending: false },
      ],
    );
    expect(bytes(input)).toBeGreaterThan(2 * 1024 * 1024);
    const { input: fitted, fits } = fitContinueInput(input);
    expect(fits).toBe(true);
    expect(bytes(fitted)).toBeLessThanOrEqual(CARRIED_INPUT_MAX_BYTES);
    expect(fitted.carried.interactions.every((i) => i.labels === undefined)).toBe(true);
    // The settled interactions go before the results: both results still did not fit.
    expect(fitted.carried.interactions).toHaveLength(0);
    expect(fitted.carried.actions?.map((a) => a.resultForgotten)).toEqual([true, true]);
  });

  test('an ask answered just before continue-as-new keeps its result: settled interactions go first', () => {
    // Labels of 1.4 MB, 40 answered asks of control characters (six bytes each in JSON: the settled
    // ones are carried without their bulk, with 1,000 characters of prompt) and the newest ask's result.
    const input = inputOf(
      'l'.repeat(1_400_000),
      Array.from({ length: 40 }, () => ({
        settled: true,
        prompt: '\u0001'.repeat(100_000),
        details: '',
        labelled: false,
      })),
      [{ result: 'yes', pending: false }],
    );
    expect(bytes(input)).toBeGreaterThan(CARRIED_INPUT_MAX_BYTES);
    const { input: fitted, fits } = fitContinueInput(input);
    expect(fits).toBe(true);
    expect(fitted.carried.actions?.[0].result).toEqual({ content: 'yes' });
    expect(fitted.carried.interactions.length).toBeLessThan(40);
  });

  test('a minimum over the bound (a spec and a pending action of 1 MiB each) does not fit', () => {
    const input = inputOf('n'.repeat(1_000_000), [], [{ result: 'x'.repeat(1_000_000), pending: true }]);
    expect(fitContinueInput(input).fits).toBe(false);
  });
});

describe('fitSnapshot keeps the snapshot query answer within the bound', () => {
  const bytesOf = (v: unknown) => Buffer.byteLength(JSON.stringify(v));
  const interaction = (id: number, pending: boolean, bulk: string, labels?: Record<string, string>) =>
    ({
      id: `int-${id}`,
      kind: 'approval',
      prompt: bulk,
      title: bulk.slice(0, 200),
      accepts: ['approve', 'deny'],
      status: pending ? 'pending' : 'answered',
      ...(labels ? { labels } : {}),
      ...(pending ? {} : { response: { decision: 'approve' }, respondedBy: 'a', contentForgotten: true }),
      createdAt: '2026-12-07T00:00:00.000Z',
    }) as InteractionRequest;
  const snapshotOf = (interactions: InteractionRequest[]) =>
    ({ runId: 'r', status: 'WAITING', interactions, childRunIds: [] }) as RunSnapshot;

  test('a suspend or resume result (fitSnapshotResult) is within the bound even when pending interactions alone are over it', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            pending: fc.boolean(),
            size: fc.integer({ min: 0, max: 200_000 }),
            char: fc.constantFrom('a', '\u0001', '€', '😀'),
          }),
          { maxLength: 20 },
        ),
        fc.constantFrom(256 * 1024, 512 * 1024),
        (drawn, max) => {
          const snapshot = snapshotOf(
            drawn.map((d, k) => {
              const bulk = d.char.repeat(d.size);
              const base = interaction(k, d.pending, bulk);
              return d.pending ? { ...base, action: { command: bulk } } : base;
            }),
          );
          const before = JSON.stringify(snapshot);
          const fitted = fitSnapshotResult(snapshot, max);
          expect(JSON.stringify(snapshot)).toBe(before); // pure
          expect(bytesOf(fitted)).toBeLessThanOrEqual(max);
          // Pending interactions are all still there (what was asked and of whom), if without their bulk.
          const pending = (s: RunSnapshot) => s.interactions.filter((i) => i.status === 'pending').map((i) => i.id);
          expect(pending(fitted)).toEqual(pending(snapshot));
          // A snapshot fitSnapshot can fit keeps every pending interaction whole.
          const query = fitSnapshot(snapshot, max);
          if (bytesOf(query) <= max) expect(fitted).toEqual(query);
        },
      ),
      { numRuns: 60 },
    );
  });

  test('arbitrary interactions: within the bound, or only pending ones left; newest settled kept; pending never dropped', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            pending: fc.boolean(),
            size: fc.integer({ min: 0, max: 40_000 }),
            char: fc.constantFrom('a', '\u0001', '€'),
            labelled: fc.boolean(),
          }),
          { maxLength: 20 },
        ),
        fc.constantFrom(64 * 1024, 128 * 1024),
        (drawn, max) => {
          const snapshot = snapshotOf(
            drawn.map((d, k) => interaction(k, d.pending, d.char.repeat(d.size), d.labelled ? { n: 'x' } : undefined)),
          );
          const before = JSON.stringify(snapshot);
          const fitted = fitSnapshot(snapshot, max);
          expect(JSON.stringify(snapshot)).toBe(before); // pure
          if (bytesOf(snapshot) <= max) return expect(fitted).toBe(snapshot);
          const ids = (s: RunSnapshot, pending: boolean) =>
            s.interactions.filter((i) => (i.status === 'pending') === pending).map((i) => i.id);
          expect(ids(fitted, true)).toEqual(ids(snapshot, true));
          // The settled ones kept are the newest.
          const settled = ids(snapshot, false);
          expect(ids(fitted, false)).toEqual(settled.slice(settled.length - ids(fitted, false).length));
          if (ids(fitted, false).length > 0) expect(bytesOf(fitted)).toBeLessThanOrEqual(max);
          // Any settled one kept back would take it over.
          const next = settled[settled.length - ids(fitted, false).length - 1];
          if (next !== undefined && bytesOf(fitted) <= max) {
            const back = snapshot.interactions.find((i) => i.id === next)!;
            expect(bytesOf(fitted) + bytesOf(back)).toBeGreaterThan(max);
          }
        },
      ),
      { numRuns: 100 },
    );
  });

  test('50 settled asks of control characters and a pending 1 MB command: within 1.5 MiB', () => {
    const c = '\u0001';
    const settled = Array.from({ length: 50 }, (_, k) => ({
      ...interaction(k, false, c.repeat(1_000)),
      options: Array.from({ length: 20 }, (_, o) => c.repeat(199) + String.fromCharCode(65 + o)),
    }));
    const pending = { ...interaction(50, true, 'run?'), action: { command: 'c'.repeat(1_000_000) } };
    const snapshot = snapshotOf([...settled, pending]);
    expect(bytesOf(snapshot)).toBeGreaterThan(2 * 1024 * 1024);
    const fitted = fitSnapshot(snapshot);
    expect(bytesOf(fitted)).toBeLessThanOrEqual(SNAPSHOT_QUERY_MAX_BYTES);
    expect(SNAPSHOT_QUERY_MAX_BYTES).toBe(1.5 * 1024 * 1024);
    expect(fitted.interactions.at(-1)).toEqual(pending);
    expect(fitted.interactions.length).toBeGreaterThan(1);
  });
});

// The memo of pending interactions is a command of the workflow task that asks, next to the Update's
// input (up to 1 MiB) and the webhook delivery's (up to 1.5 MiB): whole, with the Run's labels, it
// took that task past gRPC's 4 MiB message (api/task-completion-size).
describe('fitPendingMemo keeps the memo of pending interactions within PENDING_MEMO_MAX_BYTES', () => {
  const pendingOf = (k: number, prompt: string, command: string, labels?: Record<string, string>) =>
    withRunLabels(
      {
        id: `int-${k}`,
        prompt,
        ...(command ? { action: { command, diff: command } } : {}),
        details: command.slice(0, 20_000),
        accepts: ['approve', 'deny'],
        createdAt: '2026-12-07T00:00:00.000Z',
        status: 'pending',
      } as InteractionRequest,
      labels,
    );

  test('whole (as pendingMemo) when it fits; else every entry listed, in order, without bulk or labels, within the bound', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            prompt: fc.integer({ min: 1, max: 10_000 }),
            command: fc.integer({ min: 0, max: 300_000 }),
            labels: fc.integer({ min: 0, max: 300_000 }),
            char: fc.constantFrom('a', '\u0001', '€', '😀'),
          }),
          { maxLength: 8 },
        ),
        (drawn) => {
          const pending = drawn.map((d, k) =>
            pendingOf(
              k,
              d.char.repeat(d.prompt),
              d.char.repeat(d.command),
              d.labels > 0 ? { note: d.char.repeat(d.labels) } : undefined,
            ),
          );
          const before = JSON.stringify(pending);
          const memo = fitPendingMemo(pending);
          expect(JSON.stringify(pending)).toBe(before); // pure
          expect(jsonBytes(memo)).toBeLessThanOrEqual(PENDING_MEMO_MAX_BYTES);
          const whole = pendingMemo(pending);
          if (jsonBytes(whole) <= PENDING_MEMO_MAX_BYTES) return expect(memo).toEqual(whole);
          expect(memo.map((i) => i.id)).toEqual(pending.map((i) => i.id));
          for (const entry of memo) {
            expect(entry).toMatchObject({ status: 'pending', contentForgotten: true });
            expect(entry.labels).toBeUndefined();
            expect(entry.action).toBeUndefined();
            expect(entry.details).toBeUndefined();
            expect(entry.prompt.length).toBeLessThanOrEqual(FORGOTTEN_PROMPT_CHARS);
          }
        },
      ),
      { numRuns: 40 },
    );
  });

  test('the ask that passed 4 MiB: labels and a command of a megabyte go as a listing of a few hundred bytes', () => {
    const asked = pendingOf(1, '\u0001'.repeat(8_000), 'c'.repeat(1_000_000), { note: 'n'.repeat(520_000) });
    expect(jsonBytes(pendingMemo([asked]))).toBeGreaterThan(1_500_000);
    const memo = fitPendingMemo([asked]);
    expect(memo).toEqual([forgetContent(asked)]);
    expect(jsonBytes(memo)).toBeLessThan(8 * 1024);
  });
});
