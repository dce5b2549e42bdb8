import { InvalidArgumentError } from 'commander';

// Option parsers shared by the commands. A refused value is a usage error (exit 2)
// that commander reports naming the option.

/**
 * A whole number from `min` to `max`, in decimal digits only: parseInt would take '2x' as 2
 * and '10s' as 10, Number would take ' 5', '0x10' and '1e2'.
 */
export function wholeNumber(min: number, max = Number.MAX_SAFE_INTEGER): (value: string) => number {
  return (value) => {
    const n = /^[0-9]+$/.test(value) ? Number(value) : Number.NaN;
    if (!(n >= min && n <= max)) throw new InvalidArgumentError(`must be a whole number from ${min} to ${max}.`);
    return n;
  };
}
