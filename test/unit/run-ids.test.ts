import fc from 'fast-check';
import { Identifier, NewRunId, RunId, RunSpec } from '../../common/schemas';
import { RUN_ID_MAX, RUN_SANDBOX_SUFFIX } from '../../common/wire-checks';
import { runSpecIssues } from '../../common/run-spec-checks';
import { childRunId, plainChildRunId } from '../../workflows/definitions';

// Run ids leave room for their sandbox's id (`<runId>-sbx`, an identifier of at most 128 characters too):
// a Run id of 125 to 128 characters was started, then failed provisioning its sandbox. A child's id
// (`<parent>.child-<n>` when its spawn gives none) never grows past that either: deeper or longer ones
// were started, but no client could address them.

const ID_CHARS = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-';
const runId = fc
  .tuple(
    fc.constantFrom(...'abcXYZ019'),
    fc.array(fc.constantFrom(...ID_CHARS), { maxLength: RUN_ID_MAX - 1 }).map((c) => c.join('')),
  )
  .map(([first, rest]) => first + rest)
  .filter((id) => NewRunId.safeParse(id).success);

test('property: a child id is an addressable Run id no caller may take, whose sandbox id is an identifier, the plain one whenever that fits', () => {
  fc.assert(
    fc.property(runId, fc.integer({ min: 1, max: 100_000 }), (parent, n) => {
      const id = childRunId(parent, n);
      expect(RunId.safeParse(id).success).toBe(true);
      expect(id.length).toBeLessThanOrEqual(RUN_ID_MAX);
      // Reserved: a Run started under it first would make the parent's spawn fail.
      expect(NewRunId.safeParse(id).error?.issues[0].message).toMatch(/must not end with "\.child-<n>"/);
      expect(Identifier.safeParse(`${id}${RUN_SANDBOX_SUFFIX}`).success).toBe(true);
      const plain = plainChildRunId(parent, n);
      if (plain.length <= RUN_ID_MAX) expect(id).toBe(plain);
      else expect(id).toMatch(/\.h[0-9a-f]{16}\.child-\d+$/);
    }),
    { numRuns: 2000 },
  );
});

test('property: different parents or numbers never share a child id, parents alike in every kept character too', () => {
  const long = fc
    .array(fc.constantFrom(...ID_CHARS), { minLength: 1, maxLength: 12 })
    .map((c) => `p${'x'.repeat(RUN_ID_MAX - 20)}${c.join('')}`)
    .filter((id) => NewRunId.safeParse(id).success);
  fc.assert(
    fc.property(
      fc.uniqueArray(fc.tuple(long, fc.integer({ min: 1, max: 20 })), {
        minLength: 2,
        maxLength: 30,
        selector: ([p, n]) => `${p}/${n}`,
      }),
      (pairs) => {
        const ids = pairs.map(([parent, n]) => childRunId(parent, n));
        expect(new Set(ids).size).toBe(ids.length);
      },
    ),
  );
});

test('thirty generations of unnamed children keep addressable ids', () => {
  let id = 'root-run';
  const seen = new Set<string>();
  for (let generation = 0; generation < 30; generation += 1) {
    id = childRunId(id, 1);
    expect(id.length).toBeLessThanOrEqual(RUN_ID_MAX);
    expect(seen.has(id)).toBe(false);
    seen.add(id);
  }
});

test.each([RUN_ID_MAX + 1, 128])(
  'a RunSpec with a %i-character runId is refused naming runId, by zod and the workflow alike',
  (length) => {
    const spec = {
      runId: 'r'.repeat(length),
      agent: { driver: 'scripted', steps: [{ complete: 'done' }] },
      sandbox: { provider: 'local' },
    };
    const zod = RunSpec.safeParse(spec);
    expect(zod.success).toBe(false);
    expect(zod.error?.issues).toEqual([
      expect.objectContaining({
        path: ['runId'],
        message: `must be at most ${RUN_ID_MAX} characters (its sandbox's id adds "-sbx")`,
      }),
    ]);
    expect(runSpecIssues(spec)).toEqual([{ path: ['runId'], message: `must be at most ${RUN_ID_MAX} characters` }]);
    expect(RunSpec.safeParse({ ...spec, runId: 'r'.repeat(RUN_ID_MAX) }).success).toBe(true);
  },
);

test('ids Stasis gives its own workflows are refused as new Run ids, with the reason, and still read as Run ids', () => {
  const table: [string, RegExp | undefined][] = [
    ['webhook-0b5e-1', /must not start with "webhook-" \(the workflow ids of webhook deliveries\)/],
    ['webhook-', /must not start with "webhook-"/],
    ['victim.child-1', /must not end with "\.child-<n>"/],
    ['a.b.child-12', /must not end with "\.child-<n>"/],
    ['sandbox-x', /must not start with "sandbox-"/],
    // Only the exact forms: a name that merely looks alike is a name.
    ['webhooks-x', undefined],
    ['my-webhook-1', undefined],
    ['x.child-', undefined],
    ['x.child-1a', undefined],
    ['x-child-1', undefined],
  ];
  for (const [id, refused] of table) {
    const parsed = NewRunId.safeParse(id);
    if (refused) expect(parsed.error?.issues.map((i) => i.message)).toEqual([expect.stringMatching(refused)]);
    else expect(parsed.success).toBe(true);
    // A Run that has such an id (a child, one started before) is still addressed by it.
    if (!id.startsWith('sandbox-')) expect(RunId.safeParse(id).success).toBe(true);
  }
  // Through a whole spec, at the top and in a spawn step alike, naming the field.
  const spec = (runId: string, childId: string) => ({
    runId,
    agent: {
      driver: 'scripted',
      steps: [{ spawn: { runId: childId, agent: { driver: 'scripted', steps: [] }, sandbox: { provider: 'local' } } }],
    },
    sandbox: { provider: 'local' },
  });
  expect(RunSpec.safeParse(spec('webhook-a-2', 'ok')).error?.issues[0].path).toEqual(['runId']);
  expect(RunSpec.safeParse(spec('ok', 'p.child-1')).error?.issues[0].path).toEqual([
    'agent',
    'steps',
    0,
    'spawn',
    'runId',
  ]);
});
