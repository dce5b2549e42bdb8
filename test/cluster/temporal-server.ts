import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { Connection } from '@temporalio/client';
import { msToTs } from '@temporalio/common/lib/time';
import type { TemporalConnectionOptions } from '../../common/temporal-connection';
import { spawnGroup, stopGroup, type GroupProcess } from '../../platform/process-group';
import { waitForTemporal } from '../../platform/temporal-server';
import { logTail, retryUntil } from '../../platform/wait';
import type { Certs } from './certs';
import type { Postgres } from './postgres';

// The Temporal server (not the dev server) as a production deployment runs it:
// PostgreSQL persistence and visibility with schemas set up by temporal-sql-tool,
// the frontend serving mTLS only, the dynamic config of deploy/temporal, the
// namespace registered and the Stasis search attributes added over the API.

const ROOT = path.resolve(__dirname, '..', '..');
export const DYNAMIC_CONFIG = path.join(ROOT, 'deploy', 'temporal', 'dynamicconfig.yaml');

const run = promisify(execFile);

/** The same steps as the temporal-schema job of docker-compose.temporal.yml. */
export async function setupSchemas(sqlTool: string, pg: Postgres): Promise<void> {
  for (const [db, schema] of [
    ['temporal', 'postgresql/v12/temporal'],
    ['temporal_visibility', 'postgresql/v12/visibility'],
  ]) {
    const sql = (...args: string[]) =>
      run(sqlTool, [
        '--plugin',
        'postgres12',
        '--ep',
        '127.0.0.1',
        '-p',
        String(pg.port),
        '-u',
        pg.user,
        '--pw',
        pg.password,
        '--db',
        db,
        ...args,
      ]);
    await sql('create-database');
    await sql('setup-schema', '-v', '0.0');
    await sql('update-schema', '--schema-name', schema);
  }
}

export interface TemporalCluster {
  /** 127.0.0.1:<port> of the frontend (mTLS). */
  address: string;
  namespace: string;
  logFile: string;
  restart(): Promise<void>;
  stop(): Promise<void>;
}

function serverConfig(ports: number[], pg: Postgres, certs: Certs): string {
  const [
    frontend,
    frontendHttp,
    frontendMember,
    history,
    historyMember,
    matching,
    matchingMember,
    worker,
    workerMember,
  ] = ports;
  const store = (db: string, maxConns: number) => `
      sql:
        pluginName: postgres12
        databaseName: ${db}
        connectAddr: "127.0.0.1:${pg.port}"
        connectProtocol: tcp
        user: ${pg.user}
        password: ${pg.password}
        maxConns: ${maxConns}
        maxIdleConns: ${maxConns}
        maxConnLifetime: 1h`;
  const service = (grpc: number, membership: number, extra = '') => `
    rpc:
      grpcPort: ${grpc}
      membershipPort: ${membership}
      bindOnLocalHost: true${extra}`;
  return `log:
  stdout: true
  level: warn
persistence:
  defaultStore: default
  visibilityStore: visibility
  numHistoryShards: 4
  datastores:
    default:${store('temporal', 20)}
    visibility:${store('temporal_visibility', 10)}
global:
  membership:
    maxJoinDuration: 30s
    broadcastAddress: 127.0.0.1
  tls:
    frontend:
      server:
        certFile: ${certs.serverCert}
        keyFile: ${certs.serverKey}
        requireClientAuth: true
        clientCaFiles: [${certs.ca}]
      client:
        serverName: localhost
        rootCaFiles: [${certs.ca}]
    systemWorker:
      certFile: ${certs.clientCert}
      keyFile: ${certs.clientKey}
      client:
        serverName: localhost
        rootCaFiles: [${certs.ca}]
services:
  frontend:${service(frontend, frontendMember, `\n      httpPort: ${frontendHttp}`)}
  history:${service(history, historyMember)}
  matching:${service(matching, matchingMember)}
  worker:${service(worker, workerMember)}
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: frontend
      rpcAddress: "localhost:${frontend}"
dcRedirectionPolicy:
  policy: noop
dynamicConfigClient:
  filepath: ${DYNAMIC_CONFIG}
  pollInterval: 10s
`;
}

/**
 * Free ports below 32768: the server records its membership ports in a smallint
 * column, and the kernel's ephemeral ports (what port 0 gives) lie above it.
 */
async function lowFreePorts(count: number): Promise<number[]> {
  const ports: number[] = [];
  while (ports.length < count) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    if (ports.includes(port)) continue;
    const free = await new Promise<boolean>((resolve) => {
      const server = net.createServer();
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
    });
    if (free) ports.push(port);
  }
  return ports;
}

/** Connection options a Stasis process gets from TEMPORAL_TLS_* (the tests use the same files). */
export function mtlsOptions(address: string, certs: Certs): TemporalConnectionOptions {
  return {
    address,
    tls: {
      serverNameOverride: 'localhost',
      serverRootCACertificate: readFileSync(certs.ca),
      clientCertPair: { crt: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) },
    },
  };
}

export async function startTemporalCluster(options: {
  dir: string;
  server: string;
  pg: Postgres;
  certs: Certs;
  namespace: string;
}): Promise<TemporalCluster> {
  const { dir, server, pg, certs, namespace } = options;
  const ports = await lowFreePorts(9);
  const address = `127.0.0.1:${ports[0]}`;
  mkdirSync(path.join(dir, 'config'), { recursive: true });
  writeFileSync(path.join(dir, 'config', 'development.yaml'), serverConfig(ports, pg, certs));
  const logFile = path.join(dir, 'temporal.log');
  let child: GroupProcess | undefined;
  const connection = mtlsOptions(address, certs);

  const start = async (): Promise<void> => {
    const started = spawnGroup(
      server,
      ['--root', dir, '--config', 'config', '--env', 'development', '--allow-no-auth', 'start'],
      {
        logFile,
      },
    );
    child = started;
    const gaveUp = () =>
      started.hasExited() ? `temporal server exited; log ${logFile}:\n${logTail(logFile)}` : undefined;
    await retryUntil(`Temporal server at ${address}`, 120_000, gaveUp, async () => {
      const conn = await Connection.connect({ ...connection, connectTimeout: 2_000 });
      try {
        await conn.workflowService.getSystemInfo({});
      } finally {
        await conn.close();
      }
    });
  };
  const stop = async (): Promise<void> => {
    if (child) await stopGroup(child.pid, 30_000);
    child = undefined;
  };

  await start();
  try {
    await registerNamespace(connection, namespace);
    // Adds the Stasis search attributes through the operator API and waits until they serve.
    await waitForTemporal(connection, namespace, { timeoutMs: 120_000, register: true });
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    address,
    namespace,
    logFile,
    async restart() {
      await stop();
      await start();
    },
    stop,
  };
}

/** What `temporal operator namespace create` does, and waits until the frontend serves it. */
async function registerNamespace(options: TemporalConnectionOptions, namespace: string): Promise<void> {
  const connection = await Connection.connect(options);
  try {
    await connection.workflowService
      .registerNamespace({ namespace, workflowExecutionRetentionPeriod: msToTs('7 days') })
      .catch((err: { code?: number }) => {
        if (err.code !== 6) throw err; // ALREADY_EXISTS
      });
    await retryUntil(`namespace ${namespace}`, 60_000, undefined, () =>
      connection.workflowService.describeNamespace({ namespace }),
    );
  } finally {
    await connection.close();
  }
}
