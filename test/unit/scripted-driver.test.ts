import fc from 'fast-check';
import { walkScripted } from '../helpers/scripted-walk';
import { RunSpec } from '../../common/schemas';
import { computeRunHashes } from '../../common/hashes';
import { durationMs } from '../../common/duration';

describe('scripted driver', () => {
  test('walks every step kind in order', async () => {
    const steps = [
      { writeFile: { path: 'a.txt', content: 'hi' } },
      { ask: 'go?' },
      { expectFile: { path: 'a.txt', content: 'hi' } },
      { exec: 'cat a.txt', background: true, pauseBehavior: 'CONTINUE' },
      { hold: 'policy' },
      { spawn: { agent: { driver: 'scripted', steps: [{ complete: 1 }] }, sandbox: { provider: 'local' } } },
      { complete: { ok: true } },
    ];
    const results = [{ written: true }, { decision: 'approve' }, { content: 'hi' }, { jobId: 'j' }, {}, { runId: 'c' }];
    const actions = (await walkScripted(steps, results)).map((s) => s.action);
    expect(actions.map((a) => a.type)).toEqual([
      'writeFile',
      'interaction',
      'readFile',
      'job',
      'hold',
      'spawn',
      'complete',
    ]);
    expect(actions[3]).toEqual({
      type: 'job',
      command: 'cat a.txt',
      pauseBehavior: 'CONTINUE',
      executionAffinity: 'SANDBOX',
      background: true,
    });
    expect(actions[6]).toEqual({ type: 'complete', output: { ok: true } });
  });

  test('a denial fails the Run when onDeny is fail (the default), continues when it is continue', async () => {
    const deny = { decision: 'deny' };
    const failing = await walkScripted([{ ask: 'x' }, { exec: 'true' }], [deny]);
    expect(failing.at(-1)?.action).toMatchObject({ type: 'fail', code: 'DENIED' });
    const going = await walkScripted([{ ask: 'x', onDeny: 'continue' }, { exec: 'true' }], [deny]);
    expect(going.map((s) => s.action.type)).toEqual(['interaction', 'job', 'complete']);
  });

  test('expectFile fails on a mismatch, naming the file', async () => {
    const out = await walkScripted([{ expectFile: { path: 'f', content: 'a' } }], [{ content: 'b' }]);
    expect(out.at(-1)?.action).toMatchObject({
      type: 'fail',
      code: 'EXPECT_FILE_MISMATCH',
      message: expect.stringContaining('f'),
    });
  });

  test('property: an edited command is what the next exec runs, and what every later ask of a command shows until then', async () => {
    type Answer = { decision: 'approve' } | { decision: 'edit'; action: { command: string } };
    const step = fc.oneof(
      fc.constantFrom('a', 'b', 'c').map((c) => ({ exec: `echo ${c}` })),
      fc
        .constantFrom('a', 'b')
        .map((c) => ({ ask: 'run it?', action: { command: `echo ${c}` }, accepts: ['approve', 'edit'] })),
      fc.constant({ ask: 'go on?' }),
      fc.constant({ writeFile: { path: 'f', content: 'x' } }),
    );
    const answer: fc.Arbitrary<Answer> = fc.oneof(
      fc.constant({ decision: 'approve' as const }),
      fc.constantFrom('x', 'y', 'z').map((c) => ({ decision: 'edit' as const, action: { command: `echo ${c}` } })),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.array(step, { maxLength: 8 }),
        fc.array(answer, { minLength: 8, maxLength: 8 }),
        async (steps, answers) => {
          // Each interaction gets the next drawn answer; other actions a plain result.
          const results: unknown[] = [];
          let asked = 0;
          for (const s of steps) results.push('ask' in s ? answers[asked++] : { exitCode: 0 });
          const walked = await walkScripted(steps, results);
          // An approver's edit, waiting for the next exec step.
          let edited: string | undefined;
          walked.forEach(({ action }, i) => {
            if (action.type === 'interaction' && action.action?.command !== undefined) {
              // A second approver is shown what will run, not the step's original command.
              if (edited !== undefined) expect(action.action.command).toBe(edited);
              const given = results[i] as Answer;
              if (given.decision === 'edit') edited = given.action.command;
            }
            if (action.type === 'job') {
              expect(action.command).toBe(edited ?? (steps[i] as { exec: string }).exec);
              edited = undefined;
            }
          });
        },
      ),
    );
  });

  test('without a complete step the last result is the output', async () => {
    const out = await walkScripted([{ exec: 'echo hi' }], [{ exitCode: 0, stdout: 'hi\n' }]);
    expect(out.at(-1)?.action).toEqual({ type: 'complete', output: { exitCode: 0, stdout: 'hi\n' } });
  });
});

describe('RunSpec', () => {
  const good = { agent: { driver: 'scripted', steps: [{ exec: 'true' }] }, sandbox: { provider: 'local' } };
  test('accepts a minimal spec', () => {
    expect(RunSpec.safeParse(good).success).toBe(true);
  });
  test.each([
    [{ ...good, sandbox: {} }, 'sandbox.provider'],
    [{ ...good, agent: { driver: 'scripted', steps: [] } }, 'agent'],
    [{ ...good, policy: { ttl: '5 minutes' } }, 'policy.ttl'],
    [{ ...good, policy: { pauseMode: 'FREEZE' } }, 'policy.pauseMode'],
    [{ ...good, sandbox: { provider: 'local', workspace: { kind: 'active', hostPath: 'rel' } } }, 'sandbox.workspace'],
    [{ ...good, agent: { driver: 'scripted', steps: [{ writeFile: { path: '../x', content: '' } }] } }, 'agent'],
    [{ ...good, extra: 1 }, 'extra'],
  ])('rejects %j naming %s', (spec, field) => {
    const parsed = RunSpec.safeParse(spec);
    expect(parsed.success).toBe(false);
    const paths = parsed.error?.issues.map((i) => i.path.join('.') || i.message).join(' ');
    expect(paths).toContain(field);
  });
});

describe('hashes and durations', () => {
  const spec = {
    agent: { driver: 'scripted' as const, steps: [{ exec: 'true' }] },
    sandbox: { provider: 'local' },
    policy: { ttl: '1h' },
  };
  test('hashes are canonical: key order does not matter, content does', () => {
    const reordered = {
      sandbox: { provider: 'local' },
      policy: { ttl: '1h' },
      agent: { steps: [{ exec: 'true' }], driver: 'scripted' as const },
    };
    expect(computeRunHashes('r', spec)).toEqual(computeRunHashes('r', reordered));
    expect(computeRunHashes('r', spec).run).not.toBe(computeRunHashes('r2', spec).run);
    expect(computeRunHashes('r', { ...spec, policy: { ttl: '2h' } }).policy).not.toBe(
      computeRunHashes('r', spec).policy,
    );
    expect(computeRunHashes('r', spec).spec).toMatch(/^[0-9a-f]{64}$/);
  });
  test('durations', () => {
    expect(['30s', '5m', '2h', '1d'].map(durationMs)).toEqual([30_000, 300_000, 7_200_000, 86_400_000]);
    expect(() => durationMs('5 m')).toThrow('invalid duration');
  });
});
