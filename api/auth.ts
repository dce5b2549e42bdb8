import { createHash, timingSafeEqual } from 'node:crypto';
import type { ApiToken, Role } from '../common/roles';

// Bearer tokens from STASIS_API_TOKENS (`name:secret[:role]`). Secrets are
// compared as sha-256 digests (equal lengths for timingSafeEqual) against every
// configured token without stopping at a match, so timing tells nothing.

/** Who signed a request: the token's name and role, never its secret. */
export interface Caller {
  name: string;
  role: Role;
}

const digest = (secret: string): Buffer => createHash('sha256').update(secret, 'utf8').digest();

/** Returns a function from an Authorization header to the token's caller, or undefined. */
export function bearerAuth(tokens: readonly ApiToken[]): (header: string | undefined) => Caller | undefined {
  const known = tokens.map(({ name, role, secret }) => ({ caller: { name, role }, digest: digest(secret) }));
  return (header) => {
    const match = /^Bearer +(\S+) *$/i.exec(header ?? '');
    if (!match) return undefined;
    const presented = digest(match[1]);
    let caller: Caller | undefined;
    for (const token of known) {
      if (timingSafeEqual(presented, token.digest)) caller ??= token.caller;
    }
    return caller;
  };
}
