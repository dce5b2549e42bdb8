import fc from 'fast-check';
import { keepTail } from '../../activities/exec-output';
import { CARRIED_INTERACTIONS, carriedAggregate, type SessionAggregate } from '../../workflows/run-state';

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
