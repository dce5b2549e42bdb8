import fc from 'fast-check';
import { openToken, sealToken } from '../../client/sandbox-list';

// The sandbox list's page token: Temporal's token sealed for one list. Whatever is
// done to it on the way (cut, added to, one character changed, given to another list)
// must be refused as INVALID_ARGUMENT, never passed on to Temporal as garbage
// (another list's token is refused too: test/sandboxes/list.test.ts).

const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
const temporalToken = fc.uint8Array({ minLength: 1, maxLength: 300 });
const query = fc.string({ maxLength: 200 });
const base64urlChars = (minLength: number, maxLength: number) =>
  fc.array(fc.constantFrom(...BASE64URL), { minLength, maxLength }).map((c) => c.join(''));

/** The token sealed for `q`, checked to open whole for its own list first. */
function sealed(token: Uint8Array, q: string): string {
  const text = sealToken(token, q);
  expect(text).toMatch(/^[A-Za-z0-9_-]+$/); // what the API's schema lets through
  expect(openToken(text, q).equals(Buffer.from(token))).toBe(true);
  return text;
}

const refusedAsNextPageToken = (text: string, q: string) => {
  expect(() => openToken(text, q)).toThrow(
    expect.objectContaining({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^nextPageToken: /) }),
  );
};

test('a token cut short anywhere is refused', () => {
  fc.assert(
    fc.property(temporalToken, query, fc.nat(), (token, q, cut) => {
      const text = sealed(token, q);
      refusedAsNextPageToken(text.slice(0, cut % text.length), q);
    }),
  );
});

test('a token with characters added at its end is refused', () => {
  fc.assert(
    fc.property(temporalToken, query, base64urlChars(1, 8), (token, q, extra) => {
      refusedAsNextPageToken(sealed(token, q) + extra, q);
    }),
  );
});

test('a token with one character changed is refused', () => {
  fc.assert(
    fc.property(temporalToken, query, fc.nat(), fc.constantFrom(...BASE64URL), (token, q, at, c) => {
      const text = sealed(token, q);
      const i = at % text.length;
      fc.pre(text[i] !== c);
      refusedAsNextPageToken(text.slice(0, i) + c + text.slice(i + 1), q);
    }),
  );
});
