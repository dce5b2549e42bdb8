import * as path from 'node:path';
import { Connection } from '@temporalio/client';
import { temporalConnectConfig, type TemporalConnectionOptions } from '../common/temporal-connection';
import { encodeSearchAttributeIndexedValueType } from '@temporalio/common/lib/search-attributes';
import { SEARCH_ATTRIBUTE_TYPES } from '../workflows/search-attributes';
import { ensureBinary } from './binaries';
import { spawnGroup, stopGroup } from './process-group';
import { portAnswers } from './ports';
import { logTail, PermanentError, retryUntil } from './wait';

// The embedded Temporal dev server (SQLite file) for `stasis dev` and tests, or
// a Temporal that is already there (TEMPORAL_ADDRESS or a temporal.toml profile,
// or a dev server left running on the port), which we then use and never stop.

export interface TemporalOptions {
  /** The SQLite file and the log go here. */
  dataDir: string;
  /** Frontend gRPC port; 7233 by default. */
  port?: number;
  /** Temporal Web port; no UI when omitted (tests). */
  uiPort?: number;
  namespace?: string;
  /** Extra `temporal server start-dev` arguments, e.g. `--dynamic-config-value k=v`. */
  extraArgs?: string[];
  /** Where TEMPORAL_ADDRESS and the binary cache settings are read. */
  env?: NodeJS.ProcessEnv;
  startTimeoutMs?: number;
}

export interface TemporalServer {
  /** host:port of the frontend. */
  address: string;
  namespace: string;
  /** Temporal Web, when we know it. */
  uiUrl: string | undefined;
  /** True when this call started the server (and `stop()` will stop it). */
  started: boolean;
  pid: number | undefined;
  logFile: string | undefined;
  stop(): Promise<void>;
}

export async function startTemporal(options: TemporalOptions): Promise<TemporalServer> {
  const env = options.env ?? process.env;
  const namespace = options.namespace ?? 'default';
  const port = options.port ?? 7233;
  const timeoutMs = options.startTimeoutMs ?? 120_000;

  const configured = temporalConnectConfig(env);
  if (configured.addressConfigured) {
    const options = configured.connectionOptions;
    await waitForTemporal(options, namespace, { timeoutMs: 30_000, register: true });
    return existing(options.address, namespace, undefined);
  }
  const address = `127.0.0.1:${port}`;
  if ((await portAnswers('127.0.0.1', port)) && (await answersAsTemporal(address))) {
    await waitForTemporal({ address }, namespace, { timeoutMs: 30_000, register: true });
    const uiUrl =
      options.uiPort && (await portAnswers('127.0.0.1', options.uiPort))
        ? `http://127.0.0.1:${options.uiPort}`
        : undefined;
    return existing(address, namespace, uiUrl);
  }

  const binary = await ensureBinary('temporal', { env });
  const logFile = path.join(options.dataDir, 'logs', 'temporal.log');
  const args = [
    'server',
    'start-dev',
    '--ip',
    '127.0.0.1',
    '--port',
    String(port),
    ...(options.uiPort ? ['--ui-port', String(options.uiPort)] : ['--headless']),
    '--db-filename',
    path.join(options.dataDir, 'temporal.sqlite'),
    // The server writes through one SQLite connection; in the default rollback-journal mode every
    // commit waits for several fsyncs, and that serial wait bounded the whole system under load.
    // WAL with synchronous=NORMAL survives a crash of the server (not of the machine's power).
    '--sqlite-pragma',
    'journal_mode=wal',
    '--sqlite-pragma',
    'synchronous=normal',
    // `default` always exists; naming it again would register it twice.
    ...(namespace === 'default' ? [] : ['--namespace', namespace]),
    '--log-level',
    'warn',
    ...Object.entries(SEARCH_ATTRIBUTE_TYPES).flatMap(([name, type]) => ['--search-attribute', `${name}=${type}`]),
    ...(options.extraArgs ?? []),
  ];
  const child = spawnGroup(binary, args, { env, logFile });
  const stop = (): Promise<void> => stopGroup(child.pid);
  try {
    await waitForTemporal({ address }, namespace, {
      timeoutMs,
      register: false,
      gaveUp: () => (child.hasExited() ? `temporal exited early; log ${logFile}:\n${logTail(logFile)}` : undefined),
    });
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    address,
    namespace,
    uiUrl: options.uiPort ? `http://127.0.0.1:${options.uiPort}` : undefined,
    started: true,
    pid: child.pid,
    logFile,
    stop,
  };
}

function existing(address: string, namespace: string, uiUrl: string | undefined): TemporalServer {
  return { address, namespace, uiUrl, started: false, pid: undefined, logFile: undefined, stop: async () => {} };
}

async function answersAsTemporal(address: string): Promise<boolean> {
  try {
    const connection = await Connection.connect({ address, connectTimeout: 2_000 });
    await connection.close();
    return true;
  } catch {
    return false;
  }
}

/**
 * Waits until `address` serves `namespace` with every Stasis search attribute.
 * With `register`, missing attributes are added (a server we did not start
 * may not have them yet); otherwise the dev server registers them at start.
 */
export async function waitForTemporal(
  connectionOptions: TemporalConnectionOptions,
  namespace: string,
  options: { timeoutMs: number; register: boolean; gaveUp?: () => string | undefined },
): Promise<void> {
  const what = `Temporal at ${connectionOptions.address} (namespace ${namespace})`;
  await retryUntil(what, options.timeoutMs, options.gaveUp, async () => {
    const connection = await Connection.connect({ ...connectionOptions, connectTimeout: 2_000 });
    try {
      await connection.workflowService.describeNamespace({ namespace });
      let problems = await searchAttributeProblems(connection, namespace);
      if (problems.missing.length > 0 && options.register) {
        try {
          await connection.operatorService.addSearchAttributes({
            namespace,
            searchAttributes: Object.fromEntries(problems.missing.map((name) => [name, searchAttributeType(name)])),
          });
        } catch (error) {
          // E.g. Temporal Cloud, where attributes are added in the Cloud UI or with tcld, not the operator API.
          throw new PermanentError(
            `${problems.missing.join(', ')} are not registered and could not be added (${String(error)}); ` +
              'register them as in docker-compose.temporal.yml (temporal operator search-attribute create), ' +
              'or on Temporal Cloud in the namespace settings (see README, Running on a Temporal cluster)',
          );
        }
        problems = await searchAttributeProblems(connection, namespace);
      }
      if (problems.wrongType.length > 0) throw new PermanentError(problems.wrongType.join('; '));
      if (problems.missing.length > 0)
        throw new Error(`search attributes not registered: ${problems.missing.join(', ')}`);
    } finally {
      await connection.close();
    }
  });
}

const TYPE_NAMES = ['TEXT', 'KEYWORD', 'INT', 'DOUBLE', 'BOOL', 'DATETIME', 'KEYWORD_LIST'] as const;

function encodeType(name: (typeof TYPE_NAMES)[number]): number {
  const type = encodeSearchAttributeIndexedValueType(name);
  if (type === undefined) throw new Error(`unknown search attribute type ${name}`);
  return type;
}

/** The API's indexed-value type of a Stasis search attribute. */
export function searchAttributeType(name: string): number {
  // KeywordList (the CLI's spelling) is KEYWORD_LIST in the API.
  return encodeType(
    SEARCH_ATTRIBUTE_TYPES[name].replace(/(?<=.)([A-Z])/g, '_$1').toUpperCase() as (typeof TYPE_NAMES)[number],
  );
}

function typeName(type: number): string {
  return TYPE_NAMES.find((name) => encodeType(name) === type) ?? String(type);
}

async function searchAttributeProblems(
  connection: Connection,
  namespace: string,
): Promise<{ missing: string[]; wrongType: string[] }> {
  const { customAttributes } = await connection.operatorService.listSearchAttributes({ namespace });
  const registered = customAttributes ?? {};
  const missing: string[] = [];
  const wrongType: string[] = [];
  for (const name of Object.keys(SEARCH_ATTRIBUTE_TYPES)) {
    if (!(name in registered)) missing.push(name);
    else if (registered[name] !== searchAttributeType(name)) {
      wrongType.push(
        `${name} is registered as ${typeName(registered[name])}, Stasis needs ${SEARCH_ATTRIBUTE_TYPES[name]}`,
      );
    }
  }
  return { missing, wrongType };
}
