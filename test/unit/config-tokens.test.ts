import fc from 'fast-check';
import { loadConfig, MIN_SECRET_LENGTH } from '../../common/config';
import { configProblems as problems } from '../helpers/config';

// STASIS_API_TOKENS (`name:secret[:role],...`): roles, the shortest secret, and
// errors that never print a secret (they reach terminals, logs and CI output).

/** A secret as people write them: long enough, no separators. */
const secret = fc.stringMatching(new RegExp(`^[A-Za-z0-9_.~+/=-]{${MIN_SECRET_LENGTH},40}$`));
const shortSecret = fc.stringMatching(new RegExp(`^[A-Za-z0-9_-]{4,${MIN_SECRET_LENGTH - 1}}$`));

test('name:secret[:role] entries parse into tokens; no role is operator', () => {
  const config = loadConfig({
    STASIS_API_TOKENS:
      'ana:aaaaaaaaaaaaaaaa,ops:bbbbbbbbbbbbbbbb:operator,boss:cccccccccccccccc:admin,pat:dddddddddddddddd:approver',
  });
  expect(config.STASIS_API_TOKENS).toEqual([
    { name: 'ana', secret: 'aaaaaaaaaaaaaaaa', role: 'operator' },
    { name: 'ops', secret: 'bbbbbbbbbbbbbbbb', role: 'operator' },
    { name: 'boss', secret: 'cccccccccccccccc', role: 'admin' },
    { name: 'pat', secret: 'dddddddddddddddd', role: 'approver' },
  ]);
});

test.each([
  ['a secret shorter than 16 characters', 'ana:short-secret'],
  ['an unknown role', 'ana:aaaaaaaaaaaaaaaa:root'],
  ['a missing secret', 'ana'],
  ['too many fields', 'ana:aaaaaaaaaaaaaaaa:admin:x'],
  ['an empty entry', 'ana:aaaaaaaaaaaaaaaa,'],
  ['a name given twice', 'ana:aaaaaaaaaaaaaaaa,ana:bbbbbbbbbbbbbbbb'],
  ['a secret given twice', 'ana:aaaaaaaaaaaaaaaa,bob:aaaaaaaaaaaaaaaa'],
  ['a name with a space', 'an a:aaaaaaaaaaaaaaaa'],
])('%s is one configuration error naming STASIS_API_TOKENS', (_what, value) => {
  const lines = problems({ STASIS_API_TOKENS: value });
  expect(lines).toEqual([expect.stringMatching(/^STASIS_API_TOKENS: entry \d/)]);
});

test('no configuration error ever contains a secret, whatever is wrong around it', () => {
  // Each malformed shape puts the secret where a person might: in the secret's place, the role's, the name's.
  const shapes: ((s: string) => string)[] = [
    (s) => s, // no name
    (s) => `ana:${s}:root`, // a bad role
    (s) => `ana:${s}:admin:extra`, // a field too many
    (s) => `ana:${s},ana:${s}x`, // a name twice
    (s) => `ana:${s},bob:${s}`, // a secret twice
    (s) => `ana:${s},broken`, // another entry broken
    (s) => `ana:operator:${s}`, // role and secret swapped
    (s) => `ana bob:${s}`, // a bad name
    (s) => ` ana:${s} x`, // a space in the secret
  ];
  fc.assert(
    fc.property(secret, fc.constantFrom(...shapes), (s, shape) => {
      const lines = problems({ STASIS_API_TOKENS: shape(s) });
      expect(lines.length).toBeGreaterThan(0);
      for (const line of lines) expect(line).not.toContain(s);
    }),
    { numRuns: 300 },
  );
  fc.assert(
    fc.property(shortSecret, (s) => {
      const lines = problems({ STASIS_API_TOKENS: `ana:${s}` });
      expect(lines).toEqual([expect.stringContaining(`at least ${MIN_SECRET_LENGTH} characters`)]);
      expect(lines[0]).not.toContain(s);
    }),
  );
  // The MCP server's own token: a bad one is refused without being printed either.
  const [line] = problems({ STASIS_API_TOKEN: 'has a space-0123456789' });
  expect(line).toMatch(/^STASIS_API_TOKEN: /);
  expect(line).not.toContain('space-0123456789');
});

test.each([
  ['a euro sign (beyond Latin-1: fetch cannot send it)', 'pässwörd-€-0123456789'],
  ['a Latin-1 letter (curl sends it as UTF-8, fetch as one byte)', 'päss-0123456789abcdef'],
  ['a control character (the HTTP parser refuses it)', 'control\u0001char-0123456789'],
  ['DEL', 'delete\u007fchar-0123456789'],
])('a secret with %s can never sign in: refused by the configuration, naming the entry', (_what, secretText) => {
  expect(problems({ STASIS_API_TOKENS: `ok:aaaaaaaaaaaaaaaa,ana:${secretText}:approver` })).toEqual([
    expect.stringMatching(/^STASIS_API_TOKENS: entry 2: .*visible ASCII/),
  ]);
  expect(problems({ STASIS_API_TOKEN: secretText })).toEqual([
    expect.stringMatching(/^STASIS_API_TOKEN: .*visible ASCII/),
  ]);
});

test('only visible ASCII makes a secret: one other character anywhere is refused, and never printed', () => {
  const outside = fc.string({ unit: 'grapheme', minLength: 1, maxLength: 1 }).filter((c) => !/^[\x21-\x7e]$/.test(c));
  fc.assert(
    fc.property(secret, outside, fc.nat(), (s, c, at) => {
      // Inside the secret: spaces around an entry are trimmed, as in `a:…, b:…`.
      const i = 1 + (at % (s.length - 1));
      const bad = s.slice(0, i) + c + s.slice(i);
      const lines = problems({ STASIS_API_TOKENS: `ana:${bad}` });
      expect(lines).toEqual([expect.stringMatching(/^STASIS_API_TOKENS: entry 1: /)]);
      expect(lines[0]).not.toContain(s);
      expect(problems({ STASIS_API_TOKEN: bad })).toEqual([expect.stringMatching(/^STASIS_API_TOKEN: /)]);
    }),
    { numRuns: 300 },
  );
});

test('STASIS_HOST_PATHS: absolute directories other than /', () => {
  expect(loadConfig({ STASIS_HOST_PATHS: '/srv/projects,/home/ana/work/' }).STASIS_HOST_PATHS).toEqual([
    '/srv/projects',
    '/home/ana/work',
  ]);
  expect(loadConfig({}).STASIS_HOST_PATHS).toBeUndefined();
  for (const bad of ['relative/dir', '/', '/srv,/', '/srv/../'])
    expect(problems({ STASIS_HOST_PATHS: bad })).toEqual([expect.stringMatching(/^STASIS_HOST_PATHS: /)]);
});
