import fc from 'fast-check';
import * as path from 'node:path';
import { StasisError } from '../../common/errors';
import { CHECKPOINT_DIRS, CheckpointChecker, normaliseEntryPath } from '../../stores/archive';

// The entry path rule's fast path (one pass over an already normal path) against the rule as it was
// written first, kept here verbatim as the oracle: for any string, the same path or the same refusal.

const MAX_NAME_BYTES = 255;
const MAX_PATH_BYTES = 3072;

function refuse(entryPath: string, why: string): never {
  throw new StasisError('CHECKPOINT_INVALID', `checkpoint entry ${JSON.stringify(entryPath)} ${why}`);
}

function oracle(raw: string): string {
  if (raw.includes('\0')) refuse(raw, 'contains a NUL byte');
  if (path.posix.isAbsolute(raw) || /^[A-Za-z]:/.test(raw)) refuse(raw, 'is an absolute path');
  const parts = raw.split('/');
  if (parts.includes('..')) refuse(raw, 'contains a ".." segment');
  const kept = parts.filter((part) => part !== '' && part !== '.');
  if (kept.length === 0) refuse(raw, 'has an empty path');
  if (!(CHECKPOINT_DIRS as readonly string[]).includes(kept[0])) {
    refuse(raw, `is outside ${CHECKPOINT_DIRS.map((dir) => `${dir}/`).join(', ')}`);
  }
  if (kept.some((part) => Buffer.byteLength(part) > MAX_NAME_BYTES))
    refuse(raw, `has a name longer than ${MAX_NAME_BYTES} bytes`);
  const joined = kept.join('/');
  if (Buffer.byteLength(joined) > MAX_PATH_BYTES) refuse(raw, `is longer than ${MAX_PATH_BYTES} bytes`);
  return joined;
}

/** The answer of `fn`: the path, or the refusal's code and message. */
function answer(fn: (raw: string) => string, raw: string): string {
  try {
    return `path ${fn(raw)}`;
  } catch (err) {
    if (!(err instanceof StasisError)) throw err;
    return `refused ${err.code} ${err.message}`;
  }
}

/** Path-like strings: segments near every edge of the rules (dots, empties, NUL, non-ASCII, name and path lengths). */
const segment = fc.oneof(
  fc.constantFrom(
    ...CHECKPOINT_DIRS,
    'a',
    'b.txt',
    '.',
    '..',
    '',
    '...',
    '.git',
    'C:',
    'c:',
    '\0',
    'é',
    '日本',
    '\u{1f600}',
  ),
  fc.constantFrom(254, 255, 256).map((n) => 'x'.repeat(n)),
  fc.constantFrom(126, 127, 128).map((n) => 'é'.repeat(n)),
  fc.string({ maxLength: 6 }),
  fc.string({ unit: 'binary', maxLength: 4 }),
);
const pathLike = fc.oneof(
  fc.array(segment, { minLength: 0, maxLength: 8 }).map((parts) => parts.join('/')),
  fc
    .tuple(fc.constantFrom(...CHECKPOINT_DIRS), fc.array(fc.constantFrom(200, 250, 255), { maxLength: 16 }))
    .map(([top, lengths]) => [top, ...lengths.map((n, i) => String(i % 10).repeat(n))].join('/')),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
);

describe('normaliseEntryPath', () => {
  test('gives the same path or the same refusal as the rule it shortcuts, for any string', () => {
    fc.assert(
      fc.property(pathLike, (raw) => {
        expect(answer(normaliseEntryPath, raw)).toBe(answer(oracle, raw));
      }),
      { numRuns: 20_000 },
    );
  });

  test('edges: lengths at and past each limit, top directories alone, trailing and doubled slashes', () => {
    const cases = [
      'workspace',
      'workspace/',
      '/workspace/a',
      'workspace//a',
      'workspace/./a',
      'workspace/a/..',
      './workspace/a',
      'workspaces/a',
      'work',
      'home/a\0b',
      `workspace/${'x'.repeat(255)}`,
      `workspace/${'x'.repeat(256)}`,
      `workspace/${'é'.repeat(127)}`,
      `workspace/${'é'.repeat(128)}`,
      `workspace/${Array.from({ length: 12 }, () => 'y'.repeat(254)).join('/')}`,
      `envs/${'z'.repeat(3067)}`.slice(0, 3072),
      `envs/${Array.from({ length: 13 }, () => 'z'.repeat(235)).join('/')}`,
      'C:/workspace',
    ];
    for (const raw of cases) expect(answer(normaliseEntryPath, raw)).toBe(answer(oracle, raw));
  });

  test('the checker admits exactly what it did: the normalised path is what it records', () => {
    const checker = new CheckpointChecker();
    expect(checker.admit({ path: 'workspace', type: 'Directory', mode: 0o755, size: 0 }).path).toBe('workspace');
    expect(checker.admit({ path: './workspace/a/', type: 'Directory', mode: 0o755, size: 0 }).path).toBe('workspace/a');
    expect(() => checker.admit({ path: 'workspace/a', type: 'Directory', mode: 0o755, size: 0 })).toThrow(
      /appears twice/,
    );
  });
});
