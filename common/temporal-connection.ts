import { createPrivateKey, X509Certificate, type KeyObject } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';
import {
  loadClientConfigProfile,
  toClientOptions,
  type ClientConfigProfile,
  type ClientConfigTLS,
} from '@temporalio/envconfig';
import type { TLSConfig } from '@temporalio/common/lib/internal-non-workflow';

// How every Stasis process reaches Temporal, as every Temporal application does:
// @temporalio/envconfig reads the `temporal.toml` profile (TEMPORAL_CONFIG_FILE,
// TEMPORAL_PROFILE) and the TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY
// and TEMPORAL_TLS_* variables over it. The options fit both the client's
// Connection and the worker's NativeConnection.

/** Where Stasis looks for Temporal when neither the environment nor a profile names an address. */
export const DEFAULT_TEMPORAL_ADDRESS = 'localhost:7233';
export const DEFAULT_TEMPORAL_NAMESPACE = 'default';

/** Options accepted by both `Connection.connect` and `NativeConnection.connect`. */
export interface TemporalConnectionOptions {
  address: string;
  tls?: TLSConfig | boolean;
  apiKey?: string;
  metadata?: Record<string, string>;
}

export interface TemporalConnectConfig {
  connectionOptions: TemporalConnectionOptions;
  namespace: string;
  /** False when the address is the default: nothing named a server (`stasis dev` then starts its own). */
  addressConfigured: boolean;
}

/** The TLS material of a profile, each with the variable (and temporal.toml key) that gives it. */
const TLS_FILES = [
  { field: 'serverCACert', variable: 'TEMPORAL_TLS_SERVER_CA_CERT', key: 'server_ca_cert' },
  { field: 'clientCert', variable: 'TEMPORAL_TLS_CLIENT_CERT', key: 'client_cert' },
  { field: 'clientKey', variable: 'TEMPORAL_TLS_CLIENT_KEY', key: 'client_key' },
] as const;

/**
 * The connection of the profile and environment in `env`. Empty variables count as
 * unset. Throws an Error naming the variable, file or profile that is wrong (an unknown
 * TEMPORAL_PROFILE, a TLS file that cannot be read, TLS off next to TLS material); the
 * contents of temporal.toml and of the TLS files are never quoted.
 */
export function temporalConnectConfig(env: NodeJS.ProcessEnv = process.env): TemporalConnectConfig {
  const set = Object.fromEntries(
    Object.entries(env).filter((entry): entry is [string, string] => entry[1] !== undefined && entry[1] !== ''),
  );
  // envconfig takes only exactly "true" or "1" as TLS on: anything else (TRUE, yes) would be TLS off.
  if (set.TEMPORAL_TLS !== undefined) {
    const tls = set.TEMPORAL_TLS.toLowerCase();
    if (!['true', '1', 'false', '0'].includes(tls))
      throw new Error(`TEMPORAL_TLS: must be true, false, 1 or 0 (got ${JSON.stringify(set.TEMPORAL_TLS)})`);
    set.TEMPORAL_TLS = tls === 'true' || tls === '1' ? 'true' : 'false';
  }
  // envconfig looks the profile up in a plain object: "__proto__" or "constructor" would
  // find Object's own members and write the connection's fields onto them.
  const profileName = set.TEMPORAL_PROFILE;
  if (profileName !== undefined && (!/^[A-Za-z0-9_.-]+$/.test(profileName) || profileName in Object.prototype))
    throw new Error('TEMPORAL_PROFILE: must be a profile name (letters, digits, "_", "-" or ".")');
  const file = configFile(set);
  if (set.TEMPORAL_CONFIG_FILE !== undefined) {
    // envconfig ignores a missing file; one named explicitly must be there.
    let problem;
    try {
      if (!statSync(set.TEMPORAL_CONFIG_FILE).isFile()) problem = 'not a file';
    } catch (err) {
      problem = `cannot read (${(err as NodeJS.ErrnoException).code})`;
    }
    if (problem !== undefined) throw new Error(`${file.label}: ${problem}`);
  }
  let profile: ClientConfigProfile;
  try {
    profile = loadProfile(set, profileName);
  } catch (err) {
    throw new Error(profileError(err, file.label, profileName), { cause: err });
  }
  const tls = profile.tls;
  if (tls !== undefined) checkTls(tls, set, file.path);
  const { address, tls: tlsOptions, apiKey } = toClientOptions(profile).connectionOptions;
  const metadata = profile.grpcMeta;
  return {
    connectionOptions: {
      address: address ?? DEFAULT_TEMPORAL_ADDRESS,
      ...(tlsOptions !== undefined && tlsOptions !== null ? { tls: tlsOptions } : {}),
      ...(apiKey !== undefined && typeof apiKey === 'string' ? { apiKey } : {}),
      ...(metadata !== undefined ? { metadata } : {}),
    },
    namespace: profile.namespace ?? DEFAULT_TEMPORAL_NAMESPACE,
    addressConfigured: address !== undefined,
  };
}

/**
 * envconfig's profile, with a temporal.toml that holds no `[profile.*]` table (empty, comments only)
 * read as envconfig means to read a file without the profile: the environment alone, unless a profile
 * was named. envconfig itself throws a TypeError there ("reading 'default'").
 */
function loadProfile(env: Record<string, string>, profileName: string | undefined): ClientConfigProfile {
  try {
    return loadClientConfigProfile({ overrideEnvVars: env });
  } catch (err) {
    if (!(err instanceof TypeError)) throw err;
    if (profileName !== undefined) throw new Error(`Profile '${profileName}' not found in config data`, { cause: err });
    return loadClientConfigProfile({ overrideEnvVars: env, disableFile: true });
  }
}

/**
 * Refuses TLS off next to TLS material and a client certificate without its key (or the reverse),
 * and reads the TLS files, so that an unreadable one names the variable or key that gave it.
 * The files' contents replace their paths in `tls`.
 */
function checkTls(tls: ClientConfigTLS, env: Record<string, string>, file: string): void {
  // Where a field came from: the variable when it is set (it wins over the profile), else the profile.
  const origin = ({ variable, key }: (typeof TLS_FILES)[number]) => {
    const given = [`${variable}_PATH`, `${variable}_DATA`].filter((name) => env[name] !== undefined);
    return given.length > 0 ? given.join(' and ') : `tls.${key}_path/_data of ${file}`;
  };
  const material = TLS_FILES.filter((f) => tls[f.field] !== undefined);
  if (tls.disabled === true && material.length > 0) {
    const off = env.TEMPORAL_TLS !== undefined ? 'TEMPORAL_TLS' : `tls.disabled of ${file}`;
    throw new Error(`${off}: TLS is off, but ${material.map(origin).join(', ')} give TLS material`);
  }
  const [, cert, key] = TLS_FILES;
  for (const [given, missing] of [
    [cert, key],
    [key, cert],
  ]) {
    if (tls[given.field] !== undefined && tls[missing.field] === undefined)
      throw new Error(
        `${missing.variable}_PATH (or ${missing.variable}_DATA): must be set with ${origin(given)} (mTLS needs both the certificate and its key)`,
      );
  }
  for (const f of material) {
    const source = tls[f.field];
    if (source === undefined || !('path' in source)) continue;
    try {
      tls[f.field] = { data: Uint8Array.from(readFileSync(source.path)) };
    } catch (err) {
      const reason = (err as NodeJS.ErrnoException).code ?? errorText(err);
      throw new Error(`${origin(f)}: cannot read ${source.path} (${reason})`, { cause: err });
    }
  }
  checkPem(tls, origin);
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g;

/**
 * Refuses TLS material the connection could not use, naming where it came from: a certificate
 * that is not PEM, a key that is not an unencrypted PEM private key, a key that is not the client
 * certificate's. Found here, each is a configuration error at start; found by the TLS handshake it
 * was an INTERNAL or UNAVAILABLE error on the first call. Nothing of the material is quoted.
 */
function checkPem(tls: ClientConfigTLS, origin: (f: (typeof TLS_FILES)[number]) => string): void {
  const [caFile, certFile, keyFile] = TLS_FILES;
  const text = (f: (typeof TLS_FILES)[number]): string | undefined => {
    const source = tls[f.field];
    if (source === undefined || !('data' in source) || source.data === undefined) return undefined;
    return typeof source.data === 'string' ? source.data : Buffer.from(source.data).toString('latin1');
  };
  const certificates = (f: (typeof TLS_FILES)[number]): X509Certificate[] | undefined => {
    const pem = text(f);
    if (pem === undefined) return undefined;
    const blocks = pem.match(PEM_CERTIFICATE) ?? [];
    try {
      if (blocks.length === 0) throw new Error('no certificate');
      return blocks.map((block) => new X509Certificate(block));
    } catch (err) {
      throw new Error(`${origin(f)}: not a PEM certificate (-----BEGIN CERTIFICATE-----)`, { cause: err });
    }
  };
  certificates(caFile);
  const [leaf] = certificates(certFile) ?? [];
  const keyPem = text(keyFile);
  if (keyPem === undefined) return;
  let key: KeyObject;
  try {
    key = createPrivateKey({ key: keyPem, format: 'pem' });
  } catch (err) {
    throw new Error(`${origin(keyFile)}: not an unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)`, {
      cause: err,
    });
  }
  if (leaf !== undefined && !leaf.checkPrivateKey(key))
    throw new Error(`${origin(keyFile)}: not the key of the certificate in ${origin(certFile)}`);
}

/** The line for an error of envconfig's loading: the TOML parser's message quotes the file's lines, secrets too. */
function profileError(err: unknown, file: string, profileName: string | undefined): string {
  const { line, column, code } = err as { line?: unknown; column?: unknown; code?: unknown };
  if (typeof line === 'number' && typeof column === 'number')
    return `${file}: not valid TOML (line ${line}, column ${column})`;
  if (typeof code === 'string') return `${file}: cannot read (${code})`;
  // envconfig's own messages ("Profile 'x' not found", "Cannot specify both client_cert_path and
  // client_cert_data") quote no values.
  return `${profileName !== undefined && /not found/.test(errorText(err)) ? 'TEMPORAL_PROFILE' : file}: ${errorText(err)}`;
}

/**
 * temporal.toml as errors name it: TEMPORAL_CONFIG_FILE and its path, or the default path
 * (where envconfig looks; its function for that is not exported).
 */
function configFile(env: Record<string, string>): { label: string; path: string } {
  if (env.TEMPORAL_CONFIG_FILE !== undefined)
    return { label: `TEMPORAL_CONFIG_FILE: ${env.TEMPORAL_CONFIG_FILE}`, path: env.TEMPORAL_CONFIG_FILE };
  const base =
    process.platform === 'win32'
      ? env.APPDATA
      : process.platform === 'darwin'
        ? env.HOME && path.join(env.HOME, 'Library', 'Application Support')
        : (env.XDG_CONFIG_HOME ?? (env.HOME && path.join(env.HOME, '.config')));
  const file = base ? path.join(base, 'temporalio', 'temporal.toml') : 'temporal.toml';
  return { label: file, path: file };
}

function errorText(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).replace(/\s+/g, ' ');
}
