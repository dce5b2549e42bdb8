import { loadClientConfigProfile, toClientOptions } from '@temporalio/envconfig';
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

/**
 * The connection of the profile and environment in `env`. Empty variables count as
 * unset. Throws an Error naming the variable or profile that is wrong (an unknown
 * TEMPORAL_PROFILE, a TLS file that cannot be read).
 */
export function temporalConnectConfig(env: NodeJS.ProcessEnv = process.env): TemporalConnectConfig {
  const set = Object.fromEntries(
    Object.entries(env).filter((entry): entry is [string, string] => entry[1] !== undefined && entry[1] !== ''),
  );
  let profile;
  try {
    profile = loadClientConfigProfile({ overrideEnvVars: set });
  } catch (err) {
    throw new Error(`TEMPORAL_PROFILE: ${errorText(err)}`, { cause: err });
  }
  let converted;
  try {
    converted = toClientOptions(profile);
  } catch (err) {
    throw new Error(`TEMPORAL_TLS: ${errorText(err)}`, { cause: err });
  }
  const { address, tls, apiKey } = converted.connectionOptions;
  const metadata = profile.grpcMeta;
  return {
    connectionOptions: {
      address: address ?? DEFAULT_TEMPORAL_ADDRESS,
      ...(tls !== undefined && tls !== null ? { tls } : {}),
      ...(apiKey !== undefined && typeof apiKey === 'string' ? { apiKey } : {}),
      ...(metadata !== undefined ? { metadata } : {}),
    },
    namespace: converted.namespace ?? DEFAULT_TEMPORAL_NAMESPACE,
    addressConfigured: address !== undefined,
  };
}

function errorText(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).replace(/\s+/g, ' ');
}
