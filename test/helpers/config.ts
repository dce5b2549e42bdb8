import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
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
 * A writer of files in `dir`, and PEM files written with it: a server CA certificate, a client
 * certificate and its key, and a key of no certificate (`strayKey`). Real (made by the openssl CLI,
 * self-signed, EC P-256), as the connection's checks parse them; no server trusts them.
 */
export function pemFiles(dir: string) {
  const file = (name: string, content: string): string => {
    const p = path.join(dir, name);
    writeFileSync(p, content);
    return p;
  };
  const selfSigned = (name: string) => {
    const crt = path.join(dir, `${name}.pem`);
    const key = path.join(dir, `${name}.key`);
    execFileSync(
      'openssl',
      ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'].concat([
        '-keyout',
        key,
        '-out',
        crt,
        '-days',
        '2',
        '-subj',
        `/CN=${name}`,
      ]),
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    return { crt, key };
  };
  const ca = selfSigned('ca');
  const client = selfSigned('client');
  const stray = selfSigned('stray');
  return {
    file,
    ca: ca.crt,
    crt: client.crt,
    key: client.key,
    strayKey: stray.key,
    read: (p: string) => readFileSync(p, 'utf8'),
  };
}
