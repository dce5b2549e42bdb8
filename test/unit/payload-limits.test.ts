import * as fc from 'fast-check';
import { inputTooLarge, JSON_INPUT_LIMIT_BYTES, utf8Length } from '../../common/payload-limits';

// utf8Length stands in for Buffer.byteLength where there is no Buffer (workflow code): it must agree
// on every string, lone surrogates included (both count them as U+FFFD, 3 bytes).

test('utf8Length agrees with Buffer.byteLength on any string', () => {
  const anyUnits = fc
    .array(fc.integer({ min: 0, max: 0xffff }), { maxLength: 64 })
    .map((units) => String.fromCharCode(...units));
  fc.assert(
    fc.property(fc.oneof(fc.string({ unit: 'binary' }), anyUnits), (text) => {
      expect(utf8Length(text)).toBe(Buffer.byteLength(text, 'utf8'));
    }),
    { numRuns: 2_000 },
  );
});

test('inputTooLarge counts bytes, not characters, at the limit', () => {
  const ascii = 'a'.repeat(JSON_INPUT_LIMIT_BYTES - 2); // with its two quotes: exactly the limit
  expect(inputTooLarge('x', ascii)).toBeUndefined();
  expect(inputTooLarge('x', `${ascii}a`)).toMatch(/^x: must be at most 1048576 bytes as JSON \(is 1048577\)$/);
  // A third of the characters, three bytes each: over the limit.
  expect(inputTooLarge('x', '€'.repeat(JSON_INPUT_LIMIT_BYTES / 3))).toMatch(/must be at most/);
});
