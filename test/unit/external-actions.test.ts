import fc from 'fast-check';
import { ACTION_TYPES, actionBodyHash, actionRequestProblem } from '../../common/external-actions';
import { ActionRequest, type RunStatus, type RunPhase } from '../../common/schemas';
import { admitAction, type ActionFacts } from '../../workflows/lifecycle';
import { boundActions, RECENT_ACTIONS, RESULT_BUDGET_BYTES, type ActionEntry } from '../../workflows/run-external';

// The rules of an external agent's actions, without Temporal: admission, the
// bounded memory of recent results, and the workflow's zod-free check of a
// request against the wire schema the API and client apply.

const waiting: ActionFacts = {
  status: 'RUNNING',
  phase: 'ACTIVE',
  external: true,
  expiring: false,
  ending: false,
  suspendRequested: false,
};

describe('action admission', () => {
  test('admitted only while a live external Run waits for one', () => {
    expect(admitAction(waiting, 'h')).toBeUndefined();
    const refused: [Partial<ActionFacts>, string, string][] = [
      [{ external: false }, 'INVALID_STATE_TRANSITION', 'not the external driver'],
      [{ expiring: true }, 'STALE_SANDBOX_ROUTE', 'retention'],
      [{ status: 'EXPIRED' }, 'STALE_SANDBOX_ROUTE', 'retention'],
      [{ status: 'COMPLETED' }, 'INVALID_STATE_TRANSITION', 'run is COMPLETED'],
      [{ status: 'FAILED' }, 'INVALID_STATE_TRANSITION', 'run is FAILED'],
      [{ status: 'CANCELLED' }, 'INVALID_STATE_TRANSITION', 'run is CANCELLED'],
      [{ ending: true }, 'INVALID_STATE_TRANSITION', 'completing'],
      [{ inProgress: 'a1' }, 'INVALID_STATE_TRANSITION', 'a1 is still under way'],
      [{ status: 'WAITING', inProgress: 'q' }, 'INVALID_STATE_TRANSITION', 'q is still under way'],
      [{ phase: 'SUSPENDED' }, 'INVALID_STATE_TRANSITION', 'RUNNING/SUSPENDED'],
      [{ suspendRequested: true }, 'INVALID_STATE_TRANSITION', 'RUNNING/SUSPENDING'],
    ];
    for (const [change, code, message] of refused) {
      expect({ change, result: admitAction({ ...waiting, ...change }, 'h') }).toEqual({
        change,
        result: { code, message: expect.stringContaining(message) },
      });
    }
  });

  test('a known actionId is answered first, whatever the Run: same body a duplicate, another body a conflict', () => {
    const statuses: RunStatus[] = ['RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'CANCELLED', 'EXPIRED'];
    const phases: RunPhase[] = ['ACTIVE', 'SUSPENDING', 'SUSPENDED', 'RESUMING'];
    fc.assert(
      fc.property(
        fc.constantFrom(...statuses),
        fc.constantFrom(...phases),
        fc.boolean(),
        fc.boolean(),
        (status, phase, expiring, busy) => {
          const facts = { ...waiting, status, phase, expiring, ...(busy ? { inProgress: 'k' } : {}) };
          const known = { ...facts, known: { actionId: 'k', bodyHash: 'h1' } };
          expect(admitAction(known, 'h1')).toBe('duplicate');
          expect(admitAction(known, 'h2')).toMatchObject({ code: 'IDEMPOTENCY_CONFLICT' });
        },
      ),
    );
  });
});

const withResult = (i: number, result?: unknown): ActionEntry => ({
  actionId: `a${i}`,
  type: 'exec',
  bodyHash: `h${i}`,
  status: 'succeeded',
  ...(result !== undefined ? { result, resultChars: JSON.stringify(result).length, resultBytes: utf8(result) } : {}),
});
const entry = (i: number, resultChars?: number): ActionEntry =>
  withResult(i, resultChars === undefined ? undefined : 'x'.repeat(resultChars));

describe('recent actions', () => {
  test(`remembers the newest ${RECENT_ACTIONS} actionIds`, () => {
    const kept = boundActions(Array.from({ length: RECENT_ACTIONS + 5 }, (_, i) => entry(i)));
    expect(kept).toHaveLength(RECENT_ACTIONS);
    expect(kept[0].actionId).toBe('a5');
  });

  test('keeps results newest first within the budget; the newest always; older ones say they were forgotten', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: RESULT_BUDGET_BYTES * 2 }), { minLength: 1, maxLength: 30 }),
        (sizes) => {
          const kept = boundActions(sizes.map((n, i) => entry(i, n)));
          const newest = kept[kept.length - 1];
          expect(newest.result).toBeDefined();
          const older = kept.slice(0, -1).filter((e) => e.result !== undefined);
          expect(older.reduce((sum, e) => sum + utf8(e.result), 0)).toBeLessThanOrEqual(RESULT_BUDGET_BYTES);
          for (const e of kept) expect(e.result === undefined).toBe(e.resultForgotten === true);
          // Forgetting goes oldest first: no kept result is older than a forgotten one.
          const firstKept = kept.findIndex((e) => e.result !== undefined);
          expect(kept.slice(firstKept).every((e) => e.result !== undefined || e.resultForgotten)).toBe(true);
          const lastForgotten = kept.map((e) => e.resultForgotten === true).lastIndexOf(true);
          if (lastForgotten >= 0) expect(kept.slice(0, lastForgotten).every((e) => e.result === undefined)).toBe(true);
        },
      ),
    );
  });
});

describe("the workflow's check of an action request agrees with the wire schema", () => {
  const text = fc.string({ minLength: 1, maxLength: 20 }).filter((s) => !s.includes('\0') && s.trim() === s);
  const path = fc.stringMatching(/^[a-z]{1,8}(\/[a-z]{1,8}){0,2}$/);
  const action = fc.oneof(
    fc.record(
      {
        type: fc.constant('exec'),
        command: text,
        pauseBehavior: fc.constantFrom('CANCEL', 'CONTINUE', 'DETACH'),
        executionAffinity: fc.constantFrom('SANDBOX', 'EXTERNAL'),
        timeoutMs: fc.integer({ min: 1, max: 86_400_000 }),
      },
      { requiredKeys: ['type', 'command'] },
    ),
    fc.record({ type: fc.constant('writeFile'), path, content: fc.string() }),
    fc.record({ type: fc.constant('readFile'), path }),
    fc.record(
      {
        type: fc.constant('ask'),
        ask: text,
        kind: fc.constant('approval'),
        title: fc.string({ maxLength: 200 }),
        details: fc.string({ maxLength: 200 }),
        action: fc.record(
          { command: fc.string(), files: fc.array(path, { minLength: 1, maxLength: 3 }), diff: fc.string() },
          { requiredKeys: [] },
        ),
        options: fc.uniqueArray(text, { minLength: 1, maxLength: 5 }),
        accepts: fc.constantFrom(['approve', 'deny'], ['approve', 'deny', 'edit'], ['input']),
      },
      { requiredKeys: ['type', 'ask'] },
    ),
    fc.record({ type: fc.constant('complete'), output: fc.jsonValue({ maxDepth: 3 }) }, { requiredKeys: ['type'] }),
    fc.record(
      { type: fc.constant('fail'), code: fc.constantFrom('E1', 'GAVE_UP'), message: fc.string() },
      { requiredKeys: ['type', 'message'] },
    ),
  );
  const request = fc.record({ actionId: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,20}$/), action });

  test('every request the wire schema accepts, the workflow accepts', () => {
    let accepted = 0;
    fc.assert(
      fc.property(request, (input) => {
        if (!ActionRequest.safeParse(input).success) return;
        accepted += 1;
        expect(actionRequestProblem(input)).toBeUndefined();
      }),
      { numRuns: 500 },
    );
    // The generator makes valid requests, not only ones both sides refuse.
    expect(accepted).toBeGreaterThan(400);
  });

  test('a request broken in its envelope is refused by both, and the workflow names the field', () => {
    const breakIt = fc.constantFrom(
      'drop-type',
      'unknown-type',
      'unknown-field',
      'drop-required',
      'wrong-type',
      'bad-id',
      'extra-top',
      'not-object',
    );
    fc.assert(
      fc.property(request, breakIt, (valid, how) => {
        if (!ActionRequest.safeParse(valid).success) return;
        const a = { ...valid.action } as Record<string, unknown>;
        let input: unknown = { actionId: valid.actionId, action: a };
        let field: string;
        const required = Object.keys(a).find(
          (k) => k !== 'type' && ['command', 'path', 'content', 'ask', 'message'].includes(k),
        );
        switch (how) {
          case 'drop-type':
            delete a.type;
            field = 'action.type';
            break;
          case 'unknown-type':
            a.type = 'shell';
            field = 'action.type';
            break;
          case 'unknown-field':
            a.background = true;
            field = 'action.background';
            break;
          case 'drop-required':
            if (!required) return;
            delete a[required];
            field = `action.${required}`;
            break;
          case 'wrong-type':
            if (!required) return;
            a[required] = 42;
            field = `action.${required}`;
            break;
          case 'bad-id':
            input = { actionId: '../x', action: a };
            field = 'actionId';
            break;
          case 'extra-top':
            input = { actionId: valid.actionId, action: a, waitMs: 5 };
            field = 'waitMs';
            break;
          default:
            input = [valid];
            field = '(root)';
        }
        expect(ActionRequest.safeParse(input).success).toBe(false);
        expect(actionRequestProblem(input)).toMatchObject({ path: field });
      }),
      { numRuns: 500 },
    );
  });

  test('the ask rules are the same on both sides', () => {
    const cases = [
      { accepts: ['option'] },
      { kind: 'input', accepts: ['edit'] },
      { options: ['a', 'a'] },
      { accepts: ['approve', 'approve'] },
    ];
    for (const extra of cases) {
      const input = { actionId: 'q', action: { type: 'ask', ask: 'go?', ...extra } };
      expect({ extra, zod: ActionRequest.safeParse(input).success }).toEqual({ extra, zod: false });
      expect({ extra, workflow: actionRequestProblem(input)?.path }).toEqual({
        extra,
        workflow: expect.stringMatching(/^action\.(accepts|options)$/),
      });
    }
    expect(
      actionRequestProblem({ actionId: 'q', action: { type: 'ask', ask: 'go?', options: ['a'], accepts: ['option'] } }),
    ).toBeUndefined();
  });

  test('the body hash is the same for the same action whatever its key order', () => {
    expect(actionBodyHash({ type: 'exec', command: 'x', timeoutMs: 5 })).toBe(
      actionBodyHash({ timeoutMs: 5, command: 'x', type: 'exec' }),
    );
    expect(actionBodyHash({ type: 'exec', command: 'x' })).not.toBe(actionBodyHash({ type: 'exec', command: 'y' }));
    expect(ACTION_TYPES).toEqual(['exec', 'writeFile', 'readFile', 'ask', 'spawn', 'complete', 'fail']);
  });

  test('counts UTF-8 bytes of JSON, as Temporal does: non-ASCII text and escaped control characters weigh what they send', () => {
    // 256,000 "€" are 256,000 UTF-16 units but 768,000 bytes: two of them kept 1.5 MiB "within 512 KiB".
    const euros = '€'.repeat(256_000);
    const kept = boundActions([
      withResult(0, { content: euros }),
      withResult(1, { content: euros }),
      withResult(2, 'ok'),
    ]);
    expect(kept.map((e) => e.resultForgotten === true)).toEqual([true, true, false]);
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.constantFrom('€', '\u0001', 'x', '😀', '\uD800'), fc.integer({ min: 0, max: 200_000 })), {
          minLength: 1,
          maxLength: 12,
        }),
        (parts) => {
          const got = boundActions(parts.map(([ch, n], i) => withResult(i, { content: ch.repeat(n) })));
          const older = got.slice(0, -1).filter((e) => e.result !== undefined);
          expect(older.reduce((sum, e) => sum + utf8(e.result), 0)).toBeLessThanOrEqual(RESULT_BUDGET_BYTES);
          expect(got[got.length - 1].result).toBeDefined();
        },
      ),
      { numRuns: 60 },
    );
  });
});

function utf8(value: unknown): number {
  return Buffer.byteLength(JSON.stringify(value ?? null), 'utf8');
}
