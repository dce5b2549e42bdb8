import { writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { ConfigError, loadConfig } from '../../common/config';

/** The problem lines loadConfig reports for `env` (none when it loads); any other error is thrown. */
export function configProblems(env: NodeJS.ProcessEnv): string[] {
  try {
    loadConfig(env);
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  return [];
}

/**
 * A writer of files in `dir`, and placeholder PEM files written with it (a server CA, a client
 * certificate and its key): what the connection's checks read, not usable certificates.
 */
export function pemFiles(dir: string) {
  const file = (name: string, content: string): string => {
    const p = path.join(dir, name);
    writeFileSync(p, content);
    return p;
  };
  return {
    file,
    ca: file('ca.pem', '-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n'),
    crt: file('client.pem', '-----BEGIN CERTIFICATE-----\nclient\n-----END CERTIFICATE-----\n'),
    key: file('client.key', '-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n'),
  };
}
