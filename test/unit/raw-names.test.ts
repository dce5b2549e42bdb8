import fc from 'fast-check';
import { CheckpointChecker } from '../../stores/archive';
import { splitFormat, type ManifestEntry } from '../../stores/cas/manifest';
import { bytesOfName, fsPath, hasEscapes, isRawName, nameFromBytes } from '../../stores/raw-names';

// Names are bytes; checkpoints hold them as strings in the manner of Python's surrogateescape
// (stores/raw-names.ts). These hold the mapping to what restore relies on: every byte string comes
// back, no two byte strings share a string, a UTF-8 name is Node's own string, and only strings the
// mapping makes pass for names.

const anyBytes = fc.oneof(
  fc.uint8Array({ minLength: 0, maxLength: 40 }),
  // Mostly bytes from 0x80 up: invalid sequences, truncated and overlong forms, CESU surrogates.
  fc.uint8Array({ minLength: 1, maxLength: 12 }).map((bytes) => bytes.map((b) => 0x80 | b)),
  fc.string({ unit: 'binary', maxLength: 12 }).map((text) => new Uint8Array(Buffer.from(text))),
);

test('property: bytes -> name -> bytes is the identity', () => {
  fc.assert(
    fc.property(anyBytes, (bytes) => {
      const name = nameFromBytes(Buffer.from(bytes));
      expect(bytesOfName(name)).toEqual(Buffer.from(bytes));
      expect(isRawName(name)).toBe(true);
      // Through JSON, as manifests and baselines keep it.
      expect(bytesOfName(JSON.parse(JSON.stringify(name)) as string)).toEqual(Buffer.from(bytes));
    }),
    { numRuns: 2000 },
  );
});

test('property: two different byte strings never share a name', () => {
  fc.assert(
    fc.property(anyBytes, anyBytes, (a, b) => {
      fc.pre(!Buffer.from(a).equals(Buffer.from(b)));
      expect(nameFromBytes(Buffer.from(a))).not.toBe(nameFromBytes(Buffer.from(b)));
    }),
    { numRuns: 5000 },
  );
});

test('property: a UTF-8 name is the string Node makes of it, and holds no escape', () => {
  fc.assert(
    fc.property(fc.string({ unit: 'grapheme', maxLength: 20 }), (text) => {
      const bytes = Buffer.from(text);
      expect(nameFromBytes(bytes)).toBe(text);
      expect(hasEscapes(text)).toBe(false);
      expect(fsPath(text)).toBe(text);
    }),
  );
});

test('the escapes, case by case', () => {
  const cases: [number[], string][] = [
    [[0xff], '\uDCFF'],
    [[0x62, 0xff, 0x6e], 'b\uDCFFn'],
    [[0xc0, 0xaf], '\uDCC0\uDCAF'], // overlong `/`
    [[0xed, 0xb2, 0x80], '\uDCED\uDCB2\uDC80'], // CESU-8 of U+DC80
    [[0xef, 0xbf, 0xbd], '\uFFFD'], // U+FFFD itself
    [[0xf0, 0x9f, 0x98, 0x80], '\u{1F600}'],
    [[0xf0, 0x9f, 0x98], '\uDCF0\uDC9F\uDC98'],
    [[0xf4, 0x90, 0x80, 0x80], '\uDCF4\uDC90\uDC80\uDC80'], // past U+10FFFF
    [[0xc3, 0xa9, 0xe9], '\u00e9\uDCE9'],
  ];
  for (const [bytes, name] of cases) {
    expect(nameFromBytes(Buffer.from(bytes))).toBe(name);
    expect(bytesOfName(name)).toEqual(Buffer.from(bytes));
    expect(fsPath(`/x/${name}`)).toEqual(
      hasEscapes(name) ? Buffer.from([...Buffer.from('/x/'), ...bytes]) : `/x/${name}`,
    );
  }
  // Escaped, the fs must get bytes: a string with a lone surrogate would be written as EF BF BD.
  expect(Buffer.from('\uDCFF')).toEqual(Buffer.from([0xef, 0xbf, 0xbd]));
  expect(fsPath('\uDCFF')).toEqual(Buffer.from([0xff]));
});

test('strings no name maps to are not names', () => {
  for (const text of [
    '\uD800', // a high surrogate alone
    'a\uDBFFb',
    '\uDC00', // an escaped NUL
    '\uDC2F', // an escaped `/`
    '\uDC2E\uDC2E', // an escaped `..`
    '\uDC7F', // no byte below 0x80 is ever escaped
    '\uDCC3\uDCA9', // C3 A9 is "é": escaped, it would name the file "é" names
    '\uDCF0\uDC9F\uDC98\uDC80', // an emoji's bytes, escaped
    '\uDE00', // a low surrogate outside U+DC80..U+DCFF
  ]) {
    expect(isRawName(text)).toBe(false);
  }
  expect(isRawName('\uDCFF\uDCFE')).toBe(true);
  expect(isRawName('\u{1F600}')).toBe(true);
});

test('the checkpoint rules take escaped names, count their bytes, and refuse strings that are no name', () => {
  const checker = new CheckpointChecker();
  const entry = (p: string, type: 'File' | 'Directory' | 'SymbolicLink' = 'File', linkpath = '') => ({
    path: p,
    type,
    mode: 0o644,
    mtime: undefined,
    size: 0,
    linkpath,
  });
  checker.admit(entry('workspace', 'Directory'));
  // 255 escaped bytes: 255 bytes, though each would be 3 as UTF-8 of U+FFFD.
  expect(checker.admit(entry(`workspace/${'\uDCFF'.repeat(255)}`)).path).toBe(`workspace/${'\uDCFF'.repeat(255)}`);
  expect(() => checker.admit(entry(`workspace/${'\uDCFF'.repeat(256)}`))).toThrow(/longer than 255 bytes/);
  expect(checker.admit(entry('workspace/l', 'SymbolicLink', '\uDCFE/..')).linkpath).toBe('\uDCFE/..');
  for (const bad of ['workspace/\uDC2E\uDC2E/x', 'workspace/a\uDC2Fb', 'workspace/\uD800', 'workspace/\uDCC3\uDCA9']) {
    expect(() => checker.admit(entry(bad))).toThrow(/no escaped byte of a name/);
  }
  expect(() => checker.admit(entry('workspace/m', 'SymbolicLink', '\uDE00'))).toThrow(/no escaped byte of a name/);
});

test('the format changes to stasis-cas-3 only when a path or symlink target holds an escape', () => {
  const entry = (p: string, l?: string): ManifestEntry => ({
    p,
    k: l === undefined ? 'f' : 'l',
    m: 0o644,
    s: 0,
    mt: '0',
    ...(l !== undefined ? { l } : {}),
  });
  expect(splitFormat([])).toBe('stasis-cas-2');
  expect(splitFormat([entry('workspace'), entry('workspace/c\uFFFD'), entry('workspace/\u{1F600}', '\\udcff')])).toBe(
    'stasis-cas-2',
  );
  expect(splitFormat([entry('workspace'), entry('workspace/\uDCFF')])).toBe('stasis-cas-3');
  expect(splitFormat([entry('workspace'), entry('workspace/l', '../\uDCFE')])).toBe('stasis-cas-3');
});
