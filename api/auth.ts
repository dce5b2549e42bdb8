import { createHash, timingSafeEqual } from 'node:crypto';

// Bearer tokens from STASIS_API_TOKENS (`name:secret`). Secrets are compared
// as sha-256 digests (equal lengths for timingSafeEqual) against every
// configured token without stopping at a match, so timing tells nothing.

const digest = (secret: string): Buffer => createHash('sha256').update(secret, 'utf8').digest();

/** Returns a function from an Authorization header to the token's name, or undefined. */
export function bearerAuth(tokens: Map<string, string>): (header: string | undefined) => string | undefined {
  const known = [...tokens].map(([name, secret]) => ({ name, digest: digest(secret) }));
  return (header) => {
    const match = /^Bearer +(\S+) *$/i.exec(header ?? '');
    if (!match) return undefined;
    const presented = digest(match[1]);
    let name: string | undefined;
    for (const token of known) {
      if (timingSafeEqual(presented, token.digest)) name ??= token.name;
    }
    return name;
  };
}
