import fc from 'fast-check';
import { StasisError } from '../../common/errors';
import { CHECKPOINT_DIRS, CheckpointChecker, normaliseEntryPath, normaliseEntryPathInFull } from '../../stores/archive';

// The entry path rule's fast path (one pass over an already normal path) against the rule in full,
// the normaliseEntryPathInFull: for any string, the same path or the same refusal.

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
        expect(answer(normaliseEntryPath, raw)).toBe(answer(normaliseEntryPathInFull, raw));
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
    for (const raw of cases) expect(answer(normaliseEntryPath, raw)).toBe(answer(normaliseEntryPathInFull, raw));
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

// The checker's ancestor rule takes a shortcut (an entry beneath a directory admitted before it is not
// checked again): against the rule as it reads, whatever order a hostile archive puts its entries in.
describe('CheckpointChecker, entries beneath a non-directory', () => {
  type Kind = 'Directory' | 'File' | 'SymbolicLink';
  /** A small tree of names, so that paths meet: parents, children, the same path twice. */
  const entryPath = fc
    .array(fc.constantFrom('a', 'b', 'c'), { minLength: 0, maxLength: 3 })
    .chain((parts) => fc.constantFrom(...CHECKPOINT_DIRS.slice(0, 2)).map((top) => [top, ...parts].join('/')));
  const archive = fc.array(
    fc.record({ path: entryPath, type: fc.constantFrom<Kind>('Directory', 'Directory', 'File', 'SymbolicLink') }),
    { maxLength: 14 },
  );

  /** Refused or not, as the rules read: no path twice, top entries directories, no entry beneath a non-directory anywhere in the archive. */
  function refusedByTheRule(entries: { path: string; type: Kind }[]): boolean {
    const kinds = new Map<string, Kind>();
    for (const { path, type } of entries) {
      if (kinds.has(path) || (!path.includes('/') && type !== 'Directory')) return true;
      kinds.set(path, type);
    }
    return [...kinds.keys()].some((path) =>
      path
        .split('/')
        .slice(0, -1)
        .some((_, i, parts) => {
          const kind = kinds.get(parts.slice(0, i + 1).join('/'));
          return kind !== undefined && kind !== 'Directory';
        }),
    );
  }

  /** The checker's verdict, entry by entry and then whole; a refusal names an entry beneath a non-directory. */
  function refusedByTheChecker(entries: { path: string; type: Kind }[]): boolean {
    const checker = new CheckpointChecker();
    try {
      for (const { path, type } of entries) {
        checker.admit({ path, type, mode: 0o755, size: 0, ...(type === 'SymbolicLink' ? { linkpath: '/' } : {}) });
      }
      checker.finish();
      return false;
    } catch (err) {
      expect(err).toBeInstanceOf(StasisError);
      expect((err as StasisError).code).toBe('CHECKPOINT_INVALID');
      return true;
    }
  }

  test('refuses exactly the archives the rule refuses, in any order', () => {
    fc.assert(
      fc.property(archive, (entries) => {
        expect(refusedByTheChecker(entries)).toBe(refusedByTheRule(entries));
      }),
      { numRuns: 20_000 },
    );
  });

  test('a symlink that comes after a directory admitted beneath it, with a file below that directory: refused', () => {
    const entries: { path: string; type: Kind }[] = [
      { path: 'workspace', type: 'Directory' },
      { path: 'workspace/a/b', type: 'Directory' },
      { path: 'workspace/a', type: 'SymbolicLink' },
      { path: 'workspace/a/b/c', type: 'File' },
    ];
    expect(refusedByTheRule(entries)).toBe(true);
    expect(refusedByTheChecker(entries)).toBe(true);
  });
});
