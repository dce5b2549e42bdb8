import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as fc from 'fast-check';
import type { InteractionRequest, RunSnapshot, SandboxPage, SandboxView } from '../../common/schemas';
import {
  errorText,
  interactionLine,
  runText,
  sandboxListText,
  sandboxText,
  shellWord,
  terminalSafe,
} from '../../cli/format';

// The human output of the CLI: what an agent chose (a prompt, options, an error
// message, labels) must neither drive the terminal nor run as a command when a
// person pastes the answer line into a shell.

/**
 * Characters that are invisible or change what is shown (a blank glyph, a line break that is not
 * `\n`, a mark that reorders), each written out here rather than taken from common/unsafe-text.ts:
 * zero-width and bidi marks, the Arabic letter mark, word joiner and invisible operators, the
 * deprecated format characters, BOM, soft hyphen, Mongolian vowel separator, line and paragraph
 * separators, interlinear annotation, Hangul fillers, the combining grapheme joiner, the tag
 * characters (astral: "ASCII smuggling" that a person cannot see and a model reads), and the variation
 * selectors no emoji takes (U+FE00–U+FE0D, and the astral U+E0100–U+E01EF: "emoji smuggling").
 */
const INVISIBLE = [
  ...['\u200b', '\u200c', '\u200d', '\u200e', '\u200f', '\u061c', '\u2060', '\u2061', '\u2062', '\u2063'],
  ...['\u2064', '\u2065', '\u206a', '\u206f', '\ufeff', '\u00ad', '\u180e', '\u2028', '\u2029', '\ufff9'],
  ...['\ufffa', '\ufffb', '\u115f', '\u1160', '\u3164', '\uffa0', '\u034f'],
  ...['\u{e0000}', '\u{e0001}', '\u{e0041}', '\u{e007f}'],
  ...['\ufe00', '\ufe01', '\ufe0d', '\u{e0100}', '\u{e0155}', '\u{e01ef}'],
];
/**
 * What terminalSafe must never print as it is: controls, bidi, the invisible characters above, and
 * U+FE0E/U+FE0F anywhere but right after an emoji character (the one selector an emoji takes).
 */
const UNSAFE =
  // eslint-disable-next-line no-control-regex, no-misleading-character-class
  /[\u0000-\u001f\u007f-\u009f\u00ad\u034f\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0d\ufeff\uffa0\ufff9-\ufffb\u{e0000}-\u{e007f}\u{e0100}-\u{e01ef}]|(?<!\p{Emoji})[\ufe0e\ufe0f]/u;
/** Strings an attacker would write: shell syntax, quotes, escapes, controls, bidi, invisible characters, plus any other text. */
const hostile = fc.string({
  unit: fc.oneof(
    fc.constantFrom(
      ...["'", '"', '$', '(', ')', '`', '|', '[', ']', '\\', ' ', ';', '&', '*', '~', '!', '#', '<', '>', '\t'],
      ...['\n', '\r', '\u001b', '\u0007', '\u009b', '\u0085', '\u007f', '\u202e', '\u2066', '\u2069', '\u0001'],
      ...['$(touch x)', '\u001b]0;title\u0007', '\u001b[2K\u001b[1A', 'rm -rf ./build\u200b', '\u{e0069}\u{e0067}'],
      ...['\ufe0e', '\ufe0f', '\u2764', '\u{1f600}', '1', '\u20e3', '\u{1f3fb}'],
      ...INVISIBLE,
    ),
    fc.string({ unit: 'binary', maxLength: 2 }),
  ),
  maxLength: 30,
});
const noNul = (s: string) => !s.includes('\u0000');
const at = '2026-01-01T00:00:00.000Z';

/** The words bash makes of `script`'s printf arguments, NUL-separated. */
function bashWords(script: string, cwd?: string): string[] {
  const out = execFileSync('bash', ['-c', script], { encoding: 'utf8', ...(cwd ? { cwd } : {}) });
  return out.split('\u0000').slice(0, -1);
}

describe('terminalSafe', () => {
  test('leaves no control character, DEL, C1 control, bidi override or invisible character in any text', () => {
    fc.assert(fc.property(hostile, (text) => !UNSAFE.test(terminalSafe(text))));
  });

  test('shows each one visibly as \\uXXXX and leaves other text (any Unicode) as it is', () => {
    expect(terminalSafe('a\u001b[31mb\nc\u202ed\u009b')).toBe('a\\u001b[31mb\\u000ac\\u202ed\\u009b');
    fc.assert(
      fc.property(
        fc.string({ unit: 'binary' }).filter((s) => !UNSAFE.test(s)),
        (text) => terminalSafe(text) === text,
      ),
    );
  });

  test('shows each invisible character as its code point, an astral one as one \\u{XXXXX}, wherever it is', () => {
    expect(terminalSafe('rm -rf ./build\u200b')).toBe('rm -rf ./build\\u200b');
    expect(terminalSafe('deploy --env=prod\u2060')).toBe('deploy --env=prod\\u2060');
    expect(terminalSafe('ok\u{e0069}\u{e0067}')).toBe('ok\\u{e0069}\\u{e0067}');
    fc.assert(
      fc.property(fc.string(), fc.constantFrom(...INVISIBLE), fc.string(), (before, c, after) => {
        const code = c.codePointAt(0)!.toString(16);
        const shown = code.length > 4 ? `\\u{${code}}` : `\\u${code.padStart(4, '0')}`;
        const safe = terminalSafe(`${before}${c}${after}`);
        expect(safe).toContain(shown);
        expect(safe).not.toMatch(UNSAFE);
      }),
    );
  });

  test('a variation selector is shown as it is only where an emoji takes it: one, right after the emoji', () => {
    // The selectors an emoji takes: shown as the emoji they make.
    expect(terminalSafe('ship it \u2764\ufe0f')).toBe('ship it \u2764\ufe0f');
    expect(terminalSafe('step 1\ufe0f\u20e3 \u263a\ufe0e')).toBe('step 1\ufe0f\u20e3 \u263a\ufe0e');
    // After a name they make another name, which reads as the first.
    expect(terminalSafe('rm -rf ./build\ufe0f')).toBe('rm -rf ./build\\ufe0f');
    expect(terminalSafe('./build\u{e0100}')).toBe('./build\\u{e0100}');
    expect(terminalSafe('\u2764\ufe0f\ufe0f')).toBe('\u2764\ufe0f\\ufe0f');
    // Emoji smuggling: any bytes as selectors after one emoji (0x00-0x0f → U+FE00.., 0x10.. → U+E0100..).
    const selector = (byte: number) => String.fromCodePoint(byte < 16 ? 0xfe00 + byte : 0xe0100 + byte - 16);
    fc.assert(
      fc.property(fc.constantFrom('\u{1f600}', '\u2764', '#', 'a'), fc.uint8Array({ minLength: 1 }), (emoji, bytes) => {
        const hidden = [...bytes].map(selector).join('');
        const safe = terminalSafe(`${emoji}${hidden}`);
        expect(safe).not.toMatch(UNSAFE);
        // Every byte is in sight: only a first U+FE0E/U+FE0F after an emoji stays a selector.
        const kept = /\p{Emoji}/u.test(emoji) && (bytes[0] === 14 || bytes[0] === 15) ? 1 : 0;
        expect(safe.match(/\\u(\{[0-9a-f]+\}|[0-9a-f]{4})/g) ?? []).toHaveLength(bytes.length - kept);
      }),
    );
  });
});

describe('shellWord', () => {
  test('bash reads back exactly the word that was quoted, whatever it holds', () => {
    fc.assert(
      fc.property(fc.array(hostile.filter(noNul), { minLength: 1, maxLength: 5 }), (words) => {
        expect(bashWords(`printf '%s\\0' ${words.map(shellWord).join(' ')}`)).toEqual(words);
      }),
      { numRuns: 60 },
    );
  });
});

describe('the answer line of a pending interaction', () => {
  // Where the pasted commands run: a file an agent's command would create shows up here.
  let dir: string;
  beforeAll(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'stasis-paste-'))));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const pending = (options: string[], id = 'int-1'): InteractionRequest => ({
    id,
    kind: 'approval',
    prompt: 'Pick one',
    options,
    accepts: ['option'],
    createdAt: at,
    status: 'pending',
  });

  /** Each command the `[--option a|b]` alternatives of an answer line stand for, as a person would paste it. */
  function pastedCommands(line: string): string[] {
    const start = line.indexOf(' [--option ');
    expect(start).toBeGreaterThan(0);
    expect(line.endsWith(']')).toBe(true);
    const command = line.slice(0, start).replace(/^\s*answer: /, '');
    const region = line.slice(start + ' [--option '.length, -1);
    // A word is bare characters, single-quoted runs and escaped quotes; `|` between words separates choices.
    const choices = [...region.matchAll(/(?:'[^']*'|\\'|[^'|\\\s])+/g)].map((m) => m[0]);
    expect(choices.join('|')).toBe(region);
    return choices.map((choice) => `${command} --option ${choice}`);
  }

  test('pasted into bash, runs nothing an agent chose and passes each option as one word', () => {
    fc.assert(
      fc.property(fc.uniqueArray(hostile.filter(noNul), { minLength: 1, maxLength: 3 }), (options) => {
        const line = interactionLine('run-1', pending(options)).split('\n')[1]!;
        expect(line).not.toMatch(UNSAFE);
        // A stand-in for `stasis` that prints its arguments: what matters is what the shell does first.
        const script = ['stasis() { printf "%s\\0" "$@"; }', ...pastedCommands(line)].join('\n');
        const words = bashWords(script, dir);
        expect(existsSync(path.join(dir, 'x'))).toBe(false);
        expect(words).toEqual(options.flatMap((o) => ['approve', 'run-1', 'int-1', '--option', terminalSafe(o)]));
      }),
      { numRuns: 60 },
    );
  });

  test('the repro of the review: a command substitution in an option stays text', () => {
    const line = interactionLine('run-1', pending(['$(touch pwned)', 'b'])).split('\n')[1]!;
    expect(line).toBe("    answer: stasis approve run-1 int-1 [--option '$(touch pwned)'|b]");
    bashWords(['stasis() { printf "%s\\0" "$@"; }', ...pastedCommands(line)].join('\n'), dir);
    expect(existsSync(path.join(dir, 'pwned'))).toBe(false);
  });

  test('quotes an interaction id that is not a plain word', () => {
    const line = interactionLine('run-1', pending(['a'], 'int-1;touch x')).split('\n')[1]!;
    expect(line).toBe("    answer: stasis approve run-1 'int-1;touch x' [--option a]");
  });
});

describe('renderings of agent-chosen text', () => {
  test('runText: an agent-chosen failure, output, prompt and answer cannot add a line or drive the terminal', () => {
    fc.assert(
      fc.property(hostile, hostile, hostile, hostile, hostile, (code, message, output, prompt, by) => {
        const run: RunSnapshot = {
          runId: 'run-1',
          status: 'FAILED',
          childRunIds: [],
          interactions: [
            {
              id: 'int-1',
              kind: 'input',
              prompt,
              createdAt: at,
              status: 'answered',
              respondedBy: by,
              response: output,
            },
            { id: 'int-2', kind: 'input', prompt, createdAt: at, status: 'pending' },
          ],
          output,
          error: { code, message },
        } as RunSnapshot;
        const lines = runText(run).split('\n');
        // The Run, two interactions (a pending one has its answer line too), output and error.
        expect(lines).toHaveLength(6);
        for (const line of lines) expect(line).not.toMatch(UNSAFE);
      }),
    );
  });

  test('sandboxText and sandboxListText: an error, labels and a page token stay on their lines', () => {
    fc.assert(
      fc.property(hostile, hostile, hostile, hostile, (message, key, value, token) => {
        const view = {
          sandboxId: 'sbx-1',
          state: 'failed',
          provider: 'local',
          hostId: 'h',
          record: { checkpoint: { uri: `s3://b/${value}`, bytes: 10 } },
          error: { code: 'X', message },
        } as unknown as SandboxView;
        const page = {
          sandboxes: [{ sandboxId: 'sbx-1', state: 'running', provider: 'local', labels: { [key]: value } }],
          nextPageToken: token || 't',
        } as unknown as SandboxPage;
        const shown = [sandboxText(view), sandboxListText(page)].join('\n').split('\n');
        expect(shown).toHaveLength(5);
        for (const line of shown) expect(line).not.toMatch(UNSAFE);
      }),
    );
  });

  test('errorText: the repro of the review', () => {
    const evil = 'ok\u001b]0;pwned-title\u0007\u001b[2K\u001b[1A\rCOMPLETED  all good\u001b]52;c;cm0gLXJmIH4=\u0007';
    expect(errorText({ code: 'X\u001b[31mRED', message: evil })).toBe(
      'X\\u001b[31mRED: ok\\u001b]0;pwned-title\\u0007\\u001b[2K\\u001b[1A\\u000dCOMPLETED  all good\\u001b]52;c;cm0gLXJmIH4=\\u0007',
    );
  });
});
