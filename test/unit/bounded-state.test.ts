import fc from 'fast-check';
import { keepTail } from '../../activities/exec-output';
import type { InteractionRequest, RunSpec } from '../../common/schemas';
import {
  CARRIED_INTERACTIONS,
  carriedAggregate,
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
          expect(s.endsWith(tail)).toBe(true);
          expect(Buffer.byteLength(tail)).toBeLessThanOrEqual(limit);
          expect(tail).not.toContain('\uFFFD');
        },
      ),
      { numRuns: 300 },
    );
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
