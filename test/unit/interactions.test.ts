import * as fc from 'fast-check';
import { ANSWER_KINDS, answerKind, resolveAccepts, type AnswerKind } from '../../common/interactions';
import { InteractionResponse, RunSpec } from '../../common/schemas';
import { describeIssues } from '../../common/errors';
import { parseInput } from '../../api/validate';
import { checkRespond } from '../../workflows/lifecycle';
import { AgentAction } from '../../drivers/api';
import { walkScripted } from '../helpers/scripted-walk';

// The structured interaction contract: which specs are valid, which answers an
// interaction accepts, and what the scripted driver does with an edit or a denial.

const spec = (steps: unknown[]) => ({ agent: { driver: 'scripted', steps }, sandbox: { provider: 'local' } });
/** The 400 message of POST /api/v1/runs for this body. */
const problemOf = (value: unknown): string | undefined => {
  try {
    parseInput(RunSpec, value, 'body');
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
};

describe('an ask step', () => {
  test('carries title, details, the action under review, options and accepts', () => {
    const step = {
      ask: 'Deploy?',
      title: 'Deploy web-42',
      details: '**prod** rollout',
      action: { command: 'kubectl apply -f web.yaml', files: ['web.yaml'], diff: '-a\n+b\n' },
      options: ['canary', 'full'],
      accepts: ['approve', 'deny', 'edit', 'option'],
    };
    expect(problemOf(spec([step]))).toBeUndefined();
  });

  test.each([
    [{ ask: 'x', accepts: ['option'] }, 'accepts', 'needs options'],
    [{ ask: 'x', kind: 'input', accepts: ['edit'] }, 'accepts', 'answer to an approval'],
    [{ ask: 'x', options: ['a', 'a'] }, 'options', 'distinct'],
    [{ ask: 'x', options: [] }, 'options', ''],
    [{ ask: 'x', options: [''] }, 'options', ''],
    [{ ask: 'x', options: Array.from({ length: 21 }, (_, i) => `o${i}`) }, 'options', ''],
    [{ ask: 'x', options: ['x'.repeat(201)] }, 'options', ''],
    [{ ask: 'x', title: 't'.repeat(201) }, 'title', ''],
    [{ ask: 'x', details: 'd'.repeat(20_001) }, 'details', ''],
    [{ ask: 'x', action: { diff: 'd'.repeat(1_000_001) } }, 'action.diff', ''],
    [{ ask: 'x', action: { run: 'rm -rf /' } }, 'action', ''],
    [{ ask: 'x', accepts: ['approve', 'approve'] }, 'accepts', 'distinct'],
    [{ ask: 'x', accepts: ['maybe'] }, 'accepts', ''],
    [{ ask: 'x', accepts: [] }, 'accepts', ''],
  ])('%j is refused, naming %s', (step, field, words) => {
    const problem = problemOf(spec([{ exec: 'true' }, step]));
    expect(problem).toMatch(new RegExp(`body\\.agent\\.steps\\.1\\.${field.replace('.', '\\.')}(\\.\\d+)?: `));
    expect(problem).toContain(words);
  });

  test('an agent driver answering an interaction that breaks the rules is refused the same way', () => {
    const parsed = AgentAction.safeParse({ type: 'interaction', kind: 'input', prompt: 'x', accepts: ['edit'] });
    expect(parsed.success).toBe(false);
    expect(describeIssues(parsed.error!.issues)).toMatch(/^accepts: /);
  });
});

describe('resolved accepts', () => {
  test.each([
    [{ kind: 'approval' }, ['approve', 'deny']],
    [{ kind: 'approval', options: ['a'] }, ['approve', 'deny', 'option']],
    [{ kind: 'input' }, ['input']],
    [{ kind: 'input', options: ['a'] }, ['input', 'option']],
    [{ kind: 'input', options: ['a'], accepts: ['option'] }, ['option']],
  ] as const)('%j → %j', (interaction, expected) => {
    expect(resolveAccepts(interaction)).toEqual(expected);
  });
});

// Any interaction, any well-formed answer: the respond check takes it exactly when
// its kind is accepted and (for an option) the option is offered.
const optionText = fc.string({ minLength: 1, maxLength: 8 });
const interactionArb = fc
  .record({
    kind: fc.constantFrom('approval' as const, 'input' as const),
    options: fc.option(fc.uniqueArray(optionText, { minLength: 1, maxLength: 4 }), { nil: undefined }),
    accepts: fc.option(fc.uniqueArray(fc.constantFrom(...ANSWER_KINDS), { minLength: 1 }), { nil: undefined }),
  })
  .filter(
    (i) => !(i.accepts?.includes('option') && !i.options) && !(i.accepts?.includes('edit') && i.kind === 'input'),
  );
const answerArb = (options: string[] | undefined) =>
  fc.oneof(
    fc.record({ decision: fc.constantFrom('approve' as const, 'deny' as const) }),
    fc.record({
      decision: fc.constant('edit' as const),
      // A well-formed edit: a blank command is refused by the wire checks (BLANK_COMMAND) before this.
      action: fc.record({ command: fc.string({ minLength: 1 }).filter((c) => c.trim() !== '') }),
    }),
    fc.record({ input: fc.string() }),
    fc.record({ option: options ? fc.oneof(fc.constantFrom(...options), optionText) : optionText }),
  );

test('property: an answer outside accepts, or an option not offered, is refused naming what is wrong; others pass', () => {
  fc.assert(
    fc.property(
      interactionArb.chain((i) => fc.tuple(fc.constant(i), answerArb(i.options))),
      ([spec, response]) => {
        expect(InteractionResponse.safeParse(response).success).toBe(true);
        const accepts = resolveAccepts(spec);
        const interaction = {
          id: 'int-1',
          prompt: 'p',
          createdAt: 't',
          status: 'pending' as const,
          kind: spec.kind,
          ...(spec.options ? { options: spec.options } : {}),
          accepts,
        };
        const run = { status: 'WAITING' as const, interactions: [interaction], answeredBy: {} };
        const before = JSON.stringify(run);
        const rejection = checkRespond(run, { interactionId: 'int-1', response }, 'u');
        const kind = answerKind(response) as AnswerKind;
        const fits =
          accepts.includes(kind) &&
          (kind !== 'option' || spec.options!.includes((response as { option: string }).option));
        if (fits) expect(rejection).toBeUndefined();
        else {
          expect(rejection).toMatchObject({ code: 'INVALID_ARGUMENT' });
          const message = (rejection as { message: string }).message;
          expect(message).toMatch(
            accepts.includes(kind)
              ? /^response\.option: .* is not one of the options/
              : /^response: the answer ".+" is not accepted here/,
          );
        }
        // The check is pure: the Run is unchanged whatever the answer.
        expect(JSON.stringify(run)).toBe(before);
      },
    ),
    { numRuns: 500 },
  );
});

test('an edit must change something', () => {
  expect(InteractionResponse.safeParse({ decision: 'edit', action: {} }).success).toBe(false);
  expect(InteractionResponse.safeParse({ decision: 'edit', action: { command: 'ls' }, comment: 'safer' }).success).toBe(
    true,
  );
  expect(InteractionResponse.safeParse({ option: '' }).success).toBe(false);
});

describe('the scripted driver', () => {
  test('a denial fails the Run by default (onDeny: fail)', async () => {
    const out = await walkScripted(
      [{ ask: 'Drop the table?' }, { exec: 'drop' }],
      [{ interactionId: 'int-1', decision: 'deny' }],
    );
    expect(out.map((s) => s.action.type)).toEqual(['interaction', 'fail']);
    expect(out[1].action).toMatchObject({ code: 'DENIED' });
  });

  test('an ask passes every field to the interaction', async () => {
    const step = {
      ask: 'Go?',
      title: 'T',
      details: 'D',
      action: { command: 'c' },
      options: ['a'],
      accepts: ['option', 'edit'],
    };
    const [first] = await walkScripted([step], []);
    expect(first.action).toEqual({
      type: 'interaction',
      kind: 'approval',
      prompt: 'Go?',
      title: 'T',
      details: 'D',
      action: { command: 'c' },
      options: ['a'],
      accepts: ['option', 'edit'],
    });
  });

  test('property: an edit of an ask that reviewed a command runs the edited command in place of the next exec step', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.string({ minLength: 1 }).filter((s) => !s.includes('\0')),
        fc.boolean(),
        async (edited, writeBetween) => {
          const steps = [
            { ask: 'Run it?', action: { command: 'rm -rf build' } },
            ...(writeBetween ? [{ writeFile: { path: 'a', content: '' } }] : []),
            { exec: 'rm -rf build' },
            { exec: 'echo after' },
          ];
          const answer = { interactionId: 'int-1', decision: 'edit', action: { command: edited } };
          const results = [answer, ...(writeBetween ? [{ written: true }] : []), { exitCode: 0 }, { exitCode: 0 }];
          const jobs = (await walkScripted(steps, results)).map((s) => s.action).filter((a) => a.type === 'job');
          expect(jobs.map((j) => (j as { command: string }).command)).toEqual([edited, 'echo after']);
        },
      ),
    );
  });

  test('an edit of an ask that reviewed no command changes no exec step; an approve changes nothing', async () => {
    const noCommand = await walkScripted(
      [{ ask: 'Ok?', action: { files: ['a'] } }, { exec: 'original' }],
      [{ decision: 'edit', action: { command: 'other' } }],
    );
    expect(noCommand[1].action).toMatchObject({ type: 'job', command: 'original' });
    const approved = await walkScripted(
      [{ ask: 'Ok?', action: { command: 'original' } }, { exec: 'original' }],
      [{ decision: 'approve' }],
    );
    expect(approved[1].action).toMatchObject({ type: 'job', command: 'original' });
  });
});
