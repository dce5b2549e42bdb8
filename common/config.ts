import * as os from 'node:os';
import * as path from 'node:path';
import { DEFAULT_SUSPENDED_RETENTION_SECONDS, DEFAULT_TASK_QUEUE, QUEUE_NAME, QUEUE_NAME_RULE } from './defaults';
import { z } from 'zod';
import { temporalConnectConfig, type TemporalConnectConfig } from './temporal-connection';
import type { HostPathPolicy } from './host-paths';
import { DEFAULT_ROLE, isRole, ROLES, type ApiToken } from './roles';
import { StasisError } from './errors';

// The environment (README, Configuration), read once at start-up. A bad variable stops
// the process with one line naming it.

const seconds = (fallback: number) =>
  z
    .string()
    .regex(/^[0-9]+$/, 'must be a whole number of seconds')
    .transform(Number)
    .default(fallback);

const hostPort = z.string().regex(/^[A-Za-z0-9.-]+:[0-9]{1,5}$/, 'must be host:port');

// An IPv6 address goes in brackets, [::1]:7233; the port defaults to 7233.
const temporalAddress = z
  .string()
  .regex(/^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$/, 'must be host:port')
  .refine((address) => {
    const port = /:([0-9]+)$/.exec(address)?.[1];
    return port === undefined || (Number(port) >= 1 && Number(port) <= 65535);
  }, 'the port must be from 1 to 65535');
const temporalNamespace = z.string().min(1);

/**
 * The characters of an API secret: visible ASCII. Anything else cannot sign in: a browser's or
 * Node's fetch refuses a header above U+00FF, and Node's HTTP parser refuses control characters.
 * (`:` and `,` separate the entries of STASIS_API_TOKENS, so they cannot be in a secret there.)
 */
const TOKEN_SECRET = /^[\x21-\x7e]+$/;

/** Cached Runs per worker: a few hundred MiB at most for the Runs answered soonest, however many wait. */
export const DEFAULT_MAX_CACHED_WORKFLOWS = 1_000;

export const Env = z.object({
  // Read again, with the temporal.toml profile and TEMPORAL_TLS_*, by temporalConnectConfig.
  TEMPORAL_ADDRESS: temporalAddress.optional(),
  TEMPORAL_NAMESPACE: temporalNamespace.optional(),
  STASIS_TASK_QUEUE: z.string().regex(QUEUE_NAME, QUEUE_NAME_RULE).default(DEFAULT_TASK_QUEUE),
  STASIS_HOST_ID: z
    .string()
    .regex(QUEUE_NAME, QUEUE_NAME_RULE)
    .default(os.hostname().replace(/[^A-Za-z0-9._-]/g, '-')),
  STASIS_DATA_DIR: z.string().min(1).default(path.join(process.cwd(), '.stasis')),
  STASIS_SNAPSHOT_STORE: z.enum(['s3', 'fs']).optional(),
  STASIS_S3_ENDPOINT: z.url({ message: 'must be a URL such as http://127.0.0.1:9000' }).optional(),
  STASIS_S3_BUCKET: z.string().min(3).default('stasis'),
  STASIS_S3_REGION: z.string().min(1).default('us-east-1'),
  AWS_ACCESS_KEY_ID: z.string().optional(),
  AWS_SECRET_ACCESS_KEY: z.string().optional(),
  STASIS_SUSPENDED_RETENTION_SECONDS: seconds(DEFAULT_SUSPENDED_RETENTION_SECONDS),
  STASIS_ORPHAN_DORMANT_DIR_TTL_SECONDS: seconds(86_400),
  /** Below this much free disk, dormant copies that have a checkpoint are evicted, oldest first. */
  STASIS_DISK_MIN_FREE_MB: z
    .string()
    .regex(/^[0-9]+$/, 'must be a whole number of MiB')
    .transform(Number)
    .default(1024),
  /** Each sandbox's files on their own size-limited volume: auto (where the host can), required, or off. */
  STASIS_SANDBOX_VOLUMES: z.enum(['auto', 'required', 'off']).default('auto'),
  /**
   * Runs kept in the worker's workflow cache; a Run evicted from it replays its history when it is
   * next answered. 1 is refused (the SDK needs 2 to make progress), and so is 0 (no cache): with no cache
   * the SDK core (1.24) evicts a Run while its local activities' results are still due and strands the
   * workflow task until it times out (10 s a task; temporalio/sdk-rust#1482).
   */
  STASIS_MAX_CACHED_WORKFLOWS: z
    .string()
    .regex(
      /^([2-9]|[1-9][0-9]{1,6})$/,
      'must be a whole number of Runs from 2 to 9999999 (0, no cache, strands workflow tasks in the Temporal SDK)',
    )
    .transform(Number)
    .default(DEFAULT_MAX_CACHED_WORKFLOWS),
  STASIS_HTTP_ADDR: hostPort.default('127.0.0.1:8080'),
  STASIS_API_TOKENS: z
    .string()
    .transform((value, ctx) => {
      const { tokens, problems } = parseTokens(value);
      if (problems.length > 0) ctx.addIssue({ code: 'custom', message: problems.join('; ') });
      return tokens;
    })
    .optional(),
  /** Where active workspaces may live: absolute directories, comma-separated. Unset: nowhere. */
  STASIS_HOST_PATHS: z
    .string()
    .transform((value, ctx) => {
      const paths = value.split(',').filter(Boolean);
      if (paths.some((p) => !path.isAbsolute(p) || path.resolve(p) === '/'))
        ctx.addIssue({ code: 'custom', message: 'must be absolute directories other than /, comma-separated' });
      return paths.map((p) => path.resolve(p));
    })
    .optional(),
  /** `stasis mcp`: the REST API it acts through, and the token it acts with. */
  STASIS_API_URL: z.url({ message: 'must be a URL such as http://127.0.0.1:8080' }).optional(),
  STASIS_API_TOKEN: z
    .string()
    .regex(TOKEN_SECRET, 'must be one secret of STASIS_API_TOKENS (visible ASCII characters only)')
    .optional(),
  /** The Temporal SDK's Prometheus exporter of `stasis worker` / `stasis dev`; `off` disables it. */
  STASIS_WORKER_METRICS_ADDR: z
    .string()
    .regex(/^(off|[A-Za-z0-9.-]+:[0-9]{1,5})$/, 'must be host:port or off')
    .default('127.0.0.1:9464'),
  /** This host's own Prometheus metrics (stasis_release_duration_seconds etc.) of `stasis worker` / `stasis dev`; `off` disables it. */
  STASIS_METRICS_ADDR: z
    .string()
    .regex(/^(off|[A-Za-z0-9.-]+:[0-9]{1,5})$/, 'must be host:port or off')
    .default('127.0.0.1:9465'),
  /** A workflow bundle built ahead (JSON `{code}` of bundleWorkflowCode), so a worker starts without bundling. */
  STASIS_WORKFLOW_BUNDLE: z.string().min(1).optional(),
  /** Where the worker POSTs webhook notifications of interactions and Run ends (README, "Approvals"). */
  STASIS_WEBHOOK_URL: z.url({ message: 'must be a URL such as https://hooks.example.com/stasis' }).optional(),
  /** The key of the deliveries' HMAC-SHA256 signature (the stasis-signature header). */
  STASIS_WEBHOOK_SECRET: z.string().min(16, 'must be at least 16 characters').optional(),
  /** The approval page's public address, for the links in webhook deliveries; the API's own address when unset. */
  STASIS_PUBLIC_URL: z.url({ message: 'must be a URL such as https://stasis.example.com' }).optional(),
  /** Extra provider modules to load by path, comma-separated. */
  STASIS_PROVIDERS: z.string().optional(),
  /** Extra agent-driver modules to load by path, comma-separated. */
  STASIS_DRIVERS: z.string().optional(),
});

export type Config = Omit<z.infer<typeof Env>, 'TEMPORAL_NAMESPACE'> & {
  /** The namespace of the environment or the temporal.toml profile; `default` when neither names one. */
  TEMPORAL_NAMESPACE: string;
  snapshotStore: 's3' | 'fs';
  /** How to reach Temporal (envconfig: profile, TEMPORAL_ADDRESS, TEMPORAL_API_KEY, TEMPORAL_TLS_*). */
  temporal: TemporalConnectConfig;
};

/**
 * A configuration Stasis cannot run with, one problem a line (the CLI exits 2 on it). It is a
 * {@link StasisError} (INVALID_ARGUMENT), so a library caller catching StasisError gets it too,
 * e.g. from `StasisClient.connect` to a namespace the server does not have.
 */
export class ConfigError extends StasisError {
  constructor(readonly problems: string[]) {
    super('INVALID_ARGUMENT', problems.join('\n'));
    this.name = 'ConfigError';
  }
}

/** What a namespace check needs of a connection's WorkflowService (the client's and the worker's both have it). */
interface NamespaceService {
  describeNamespace(request: { namespace: string }): Promise<unknown>;
}

/**
 * Refuses a namespace the server does not have, as a ConfigError naming the setting it came from
 * (`setting`: TEMPORAL_NAMESPACE unless the caller gave it another way): a worker polling one printed
 * a raw NotFound and then never exited, and an API server started anyway, failing every call. Any
 * other failure (the server unreachable) is left to the caller's own report.
 */
export async function checkNamespace(
  service: NamespaceService,
  namespace: string,
  address: string,
  setting = 'TEMPORAL_NAMESPACE',
): Promise<void> {
  try {
    await service.describeNamespace({ namespace });
  } catch (err) {
    // gRPC NOT_FOUND: the client's and the worker's connections both give it as `code`.
    if ((err as { code?: unknown }).code === 5) {
      throw new ConfigError([`${setting}: ${JSON.stringify(namespace)} does not exist on ${address}`]);
    }
    throw err;
  }
}

/** Reads the configuration; throws ConfigError with one line per bad variable. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const relevant = Object.fromEntries(
    Object.keys(Env.shape)
      .filter((key) => env[key] !== undefined && env[key] !== '')
      .map((key) => [key, env[key]]),
  );
  const parsed = Env.safeParse(relevant);
  if (!parsed.success) {
    throw new ConfigError(
      parsed.error.issues.map((issue) => {
        const name = String(issue.path[0]);
        // A secret is never echoed: the error goes to terminals, logs and CI output.
        const got = SECRET_VARIABLES.has(name) ? '' : ` (got ${JSON.stringify(relevant[name])})`;
        return `${name}: ${issue.message}${got}`;
      }),
    );
  }
  const config = parsed.data;
  let temporal: TemporalConnectConfig;
  try {
    temporal = temporalConnectConfig(env);
  } catch (err) {
    throw new ConfigError([(err as Error).message]);
  }
  // A profile's address and namespace (where the environment names none) pass the environment's checks.
  const profileProblems: string[] = [];
  const checks = [
    [
      'address',
      temporalAddress,
      temporal.addressConfigured && !config.TEMPORAL_ADDRESS,
      temporal.connectionOptions.address,
    ],
    ['namespace', temporalNamespace, !config.TEMPORAL_NAMESPACE, temporal.namespace],
  ] as const;
  for (const [field, schema, fromProfile, value] of checks) {
    const issue = fromProfile ? schema.safeParse(value).error?.issues[0] : undefined;
    if (issue)
      profileProblems.push(`the temporal.toml profile's ${field}: ${issue.message} (got ${JSON.stringify(value)})`);
  }
  if (profileProblems.length > 0) throw new ConfigError(profileProblems);
  const snapshotStore = config.STASIS_SNAPSHOT_STORE ?? (config.STASIS_S3_ENDPOINT ? 's3' : 'fs');
  if (snapshotStore === 's3' && !config.STASIS_S3_ENDPOINT && !env.AWS_REGION) {
    throw new ConfigError([
      'STASIS_S3_ENDPOINT: must be set when STASIS_SNAPSHOT_STORE is s3 (or set AWS_REGION for AWS S3)',
    ]);
  }
  // Half a key pair was dropped, and the AWS SDK then took whatever other credentials it found.
  const [keyId, secret] = [config.AWS_ACCESS_KEY_ID, config.AWS_SECRET_ACCESS_KEY];
  if ((keyId === undefined) !== (secret === undefined)) {
    const missing = keyId === undefined ? 'AWS_ACCESS_KEY_ID' : 'AWS_SECRET_ACCESS_KEY';
    const given = keyId === undefined ? 'AWS_SECRET_ACCESS_KEY' : 'AWS_ACCESS_KEY_ID';
    throw new ConfigError([`${missing}: must be set with ${given} (an S3 key pair is given whole)`]);
  }
  return {
    ...config,
    // AWS S3 (no endpoint) is in AWS_REGION unless STASIS_S3_REGION says otherwise: the store follows no redirects.
    STASIS_S3_REGION:
      !env.STASIS_S3_REGION && !config.STASIS_S3_ENDPOINT && env.AWS_REGION ? env.AWS_REGION : config.STASIS_S3_REGION,
    // A profile may name the server and namespace the environment does not.
    TEMPORAL_ADDRESS: temporal.addressConfigured ? temporal.connectionOptions.address : undefined,
    TEMPORAL_NAMESPACE: temporal.namespace,
    STASIS_DATA_DIR: path.resolve(config.STASIS_DATA_DIR),
    snapshotStore,
    temporal,
  };
}

/** Where webhook deliveries go, by this configuration; undefined when STASIS_WEBHOOK_URL is unset. */
export function webhookTarget(config: Config): { url: string; secret?: string; publicUrl: string } | undefined {
  if (!config.STASIS_WEBHOOK_URL) return undefined;
  return {
    url: config.STASIS_WEBHOOK_URL,
    ...(config.STASIS_WEBHOOK_SECRET ? { secret: config.STASIS_WEBHOOK_SECRET } : {}),
    publicUrl: config.STASIS_PUBLIC_URL ?? `http://${config.STASIS_HTTP_ADDR}`,
  };
}

/** Where active workspaces may live, by this configuration. */
export function hostPathPolicy(config: Config): HostPathPolicy {
  return { allowed: config.STASIS_HOST_PATHS ?? [], dataDir: config.STASIS_DATA_DIR };
}

/** Variables whose values are never printed, not even in a configuration error. */
const SECRET_VARIABLES = new Set([
  'STASIS_API_TOKENS',
  'STASIS_API_TOKEN',
  'AWS_SECRET_ACCESS_KEY',
  'STASIS_WEBHOOK_SECRET',
]);

/** Shortest secret of STASIS_API_TOKENS. */
export const MIN_SECRET_LENGTH = 16;
const TOKEN_NAME = /^[A-Za-z0-9._@-]{1,64}$/;

/**
 * Parses `STASIS_API_TOKENS` (`name:secret[:role],...`). A problem names the
 * entry by position and never quotes it: any part of it may be a secret.
 */
export function parseTokens(value: string): { tokens: ApiToken[]; problems: string[] } {
  const tokens: ApiToken[] = [];
  const problems: string[] = [];
  for (const [i, entry] of value.split(',').entries()) {
    const at = `entry ${i + 1}`;
    const [name, secret, role = DEFAULT_ROLE, ...rest] = entry.trim().split(':');
    if (secret === undefined || rest.length > 0) problems.push(`${at}: must be name:secret or name:secret:role`);
    else if (!TOKEN_NAME.test(name))
      problems.push(`${at}: the name must be 1-64 letters, digits, ".", "_", "@" or "-"`);
    else if (secret.length < MIN_SECRET_LENGTH || !TOKEN_SECRET.test(secret))
      problems.push(
        `${at}: the secret must be at least ${MIN_SECRET_LENGTH} characters of visible ASCII (letters, digits, punctuation), without ":" or ","`,
      );
    else if (!isRole(role)) problems.push(`${at}: the role must be one of ${ROLES.join(', ')}`);
    else if (tokens.some((t) => t.name === name)) problems.push(`${at}: its name is given by an earlier entry too`);
    else if (tokens.some((t) => t.secret === secret))
      problems.push(`${at}: the secret of an earlier entry is given again`);
    else tokens.push({ name, secret, role });
  }
  return { tokens, problems };
}
