import { spawn } from 'node:child_process';
import * as os from 'node:os';
import fc from 'fast-check';
import { SHELL_FROM_STDIN } from '../../providers/command';
import { startProcess, type ProcessExit } from '../../providers/spawner';

// A sandbox command travels on stdin and bash reads it itself (no cat). Whatever the caller's
// script, it must run exactly as `bash -c script` with stdin at /dev/null would: every byte of it,
// trailing newlines and backslashes included, never its own text on its stdin, no variable of ours
// left for it to see, in whatever locale the sandbox's environment sets.

const run = async (args: string[], env: Record<string, string>, stdin?: string): Promise<ProcessExit> =>
  (
    await startProcess({
      file: SHELL_FROM_STDIN[0],
      args,
      cwd: os.tmpdir(),
      env: { PATH: '/usr/bin:/bin', ...env },
      background: false,
      maxOutputBytes: 1024 * 1024,
      ...(stdin === undefined ? {} : { stdin }),
    })
  ).exited;

const fromStdin = (script: string, env: Record<string, string>) => run(SHELL_FROM_STDIN.slice(1), env, script);
const withArgv = (script: string, env: Record<string, string>) => run(['--norc', '-c', script], env);

/** `text` as one single-quoted shell word. */
const quoted = (text: string) => `'${text.replace(/'/g, `'\\''`)}'`;
const hex = (text: string) => Buffer.from(text).toString('hex');

const payload = fc.string({ unit: 'binary', maxLength: 200 }).filter((s) => !s.includes('\0'));
const fragment = fc.oneof(
  payload.map((p) => `printf %s ${quoted(p)} | od -An -tx1 -v | tr -d ' \\n'; echo`),
  payload.map((p) => `cat <<'STASIS_EOF'\n${p.replace(/STASIS_EOF/g, '')}\nSTASIS_EOF`),
  fc.constant('read -r line; echo "read $? [$line]"'),
  fc.constant('echo "REPLY=${REPLY-unset} #=$# 0=$0 TMOUT=${TMOUT-unset} STASIS_SCRIPT=${STASIS_SCRIPT-unset}"'),
  fc.constant('false; echo "after false"'),
  fc.constant('echo "${NOT_SET_ANYWHERE}"; echo "after unset"'),
  fc.constant('echo a \\'),
  fc.integer({ min: 0, max: 255 }).map((n) => `(exit ${n}); echo "status $?"`),
  fc.integer({ min: 0, max: 255 }).map((n) => `exit ${n}`),
);
const script = fc
  .tuple(fc.array(fragment, { minLength: 1, maxLength: 6 }), fc.constantFrom('', '\n', '\n\n\n', ' ', '\\\n'))
  .map(([parts, tail]) => parts.join('\n') + tail);
const locale = fc.constantFrom<Record<string, string>>({}, { LC_ALL: 'C' }, { LC_ALL: 'C.UTF-8' }, { LANG: 'POSIX' });
/**
 * Variables of the sandbox's environment that change how bash runs (it reads them at start): the
 * script must see them as `bash -c` would, and they must not change how the script is read. (xtrace
 * is left out: its trace names the commands that read the script, which `bash -c` does not run.)
 */
const shellEnv = fc.record(
  {
    SHELLOPTS: fc.constantFrom('errexit', 'nounset', 'errexit:nounset', 'pipefail:noglob'),
    TMOUT: fc.constantFrom('1', '0', 'x'),
    REPLY: fc.string({ maxLength: 5 }).filter((s) => !s.includes('\0')),
    POSIXLY_CORRECT: fc.constant('1'),
    IFS: fc.constantFrom('', 'x', ' \t'),
  },
  { requiredKeys: [] },
);
const environment = fc.tuple(locale, shellEnv).map(([a, b]) => ({ ...a, ...b }));

test('any script runs from stdin exactly as `bash -c` runs it', async () => {
  await fc.assert(
    fc.asyncProperty(script, environment, async (text, env) => {
      const [ours, reference] = await Promise.all([fromStdin(text, env), withArgv(text, env)]);
      // A syntax error names where the text came from (eval or -c); the rest must match.
      const where = (exit: ProcessExit) => ({
        ...exit,
        stderr: exit.stderr.replace(/^\/bin\/bash: (eval|-c): /gm, ''),
      });
      expect(where(ours)).toEqual(where(reference));
    }),
    { numRuns: 60 },
  );
});

test('every byte of the script arrives, its payload printed back byte for byte', async () => {
  await fc.assert(
    fc.asyncProperty(payload, async (p) => {
      const exit = await fromStdin(`printf %s ${quoted(p)} | od -An -tx1 -v | tr -d ' \\n'`, {});
      expect(exit).toMatchObject({ code: 0, stdout: hex(p), stderr: '' });
    }),
    { numRuns: 60 },
  );
});

test('a script far past the argv limit, with text after a long line and no final newline, runs whole', async () => {
  const long = 'b'.repeat(1024 * 1024);
  const exit = await fromStdin(`x=${long}\ny='multi\nline'\necho "\${#x} $y"`, {});
  expect(exit).toMatchObject({ code: 0, stdout: `${long.length} multi\nline\n`, stderr: '' });
});

test('a script that reads its stdin gets end of input, never the rest of its own text', async () => {
  const exit = await fromStdin('read -r first; echo "got $? [$first]"; cat; echo end\nsecret-line-after', {});
  expect(exit.stdout).toBe('got 1 []\nend\n');
  expect(exit.code).toBe(127); // secret-line-after ran as the (missing) command it is, not read as data
});

test('a script that arrives slowly runs whole though the environment sets TMOUT (which times out read)', async () => {
  const child = spawn(SHELL_FROM_STDIN[0], SHELL_FROM_STDIN.slice(1), {
    env: { PATH: '/usr/bin:/bin', TMOUT: '1' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stdout = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
  child.stdin.write('echo first; ');
  // Longer than TMOUT: a read that honoured it would return here and run `echo first;` alone.
  await new Promise((resolve) => setTimeout(resolve, 1_600));
  child.stdin.end('echo second');
  expect(await exited).toBe(0);
  expect(stdout).toBe('first\nsecond\n');
});
