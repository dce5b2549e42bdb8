import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as readline from 'node:readline';

// The Temporal CLI (embedded dev server) and MinIO, built once per machine with
// `go install` into a cache outside the repository, so fresh clones and CI runs
// on the same machine reuse them; and, for `npm run test:cluster` only, the
// Temporal server and its SQL schema tool. This file imports only Node built-ins
// because scripts/ensure-binaries.js loads it without a build step.

/** The newest `go` line of the modules we build (the Temporal CLI's and server's go.mod say 1.25). */
export const GO_MIN_VERSION = '1.25';

/** The Temporal server release of the cluster test and docker-compose.temporal.yml (keep them equal). */
export const TEMPORAL_SERVER_VERSION = 'v1.29.1';

interface BinarySpec {
  pkg: string;
  version: string;
  /** An executable the user names instead of ours. */
  envOverride: string;
  /** The file `go install` writes, when not the binary's name. */
  output?: string;
  /** Taken from PATH when there (any release of it will do). */
  fromPath?: boolean;
}

export const BINARIES = {
  temporal: {
    pkg: 'github.com/temporalio/cli/cmd/temporal',
    version: 'v1.5.1',
    envOverride: 'STASIS_TEMPORAL_BIN',
    fromPath: true,
  },
  // A pseudo-version: MinIO publishes no Go module tags; this is what @latest resolves to.
  minio: {
    pkg: 'github.com/minio/minio',
    version: 'v0.0.0-20260212201848-7aac2a2c5b7c',
    envOverride: 'STASIS_MINIO_BIN',
  },
  'temporal-server': {
    pkg: 'go.temporal.io/server/cmd/server',
    version: TEMPORAL_SERVER_VERSION,
    envOverride: 'STASIS_TEMPORAL_SERVER_BIN',
    output: 'server',
  },
  'temporal-sql-tool': {
    pkg: 'go.temporal.io/server/cmd/tools/sql',
    version: TEMPORAL_SERVER_VERSION,
    envOverride: 'STASIS_TEMPORAL_SQL_TOOL_BIN',
    output: 'sql',
  },
} as const satisfies Record<string, BinarySpec>;

export type BinaryName = keyof typeof BINARIES;
/** What `npm start`, `stasis dev` and `npm test` need. */
export type BinaryPaths = Record<'temporal' | 'minio', string>;

export interface EnsureOptions {
  env?: NodeJS.ProcessEnv;
  /** Progress lines; stderr by default. */
  log?: (line: string) => void;
  /** How long to wait for another process that holds the build lock. */
  lockTimeoutMs?: number;
}

export class GoMissingError extends Error {
  constructor(dir: string, detail: string) {
    super(
      `stasis needs Go to build the Temporal CLI and MinIO once into ${dir} (${detail}).\n` +
        `Install Go >= ${GO_MIN_VERSION}: https://go.dev/dl/ (older Go >= 1.21 fetches ${GO_MIN_VERSION} by itself ` +
        'when it may download toolchains), then run again. Or put a `temporal` CLI on PATH (or set ' +
        'STASIS_TEMPORAL_BIN and STASIS_MINIO_BIN), or point Stasis at servers you already run with ' +
        'TEMPORAL_ADDRESS and STASIS_S3_ENDPOINT.',
    );
    this.name = 'GoMissingError';
  }
}

/** `${STASIS_CACHE_DIR:-$HOME/.cache/stasis}/bin` */
export function binDir(env: NodeJS.ProcessEnv = process.env): string {
  const base = env.STASIS_CACHE_DIR || path.join(os.homedir(), '.cache', 'stasis');
  return path.join(base, 'bin');
}

const defaultLog = (line: string): void => {
  process.stderr.write(`${line}\n`);
};

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

/** Both binaries, building whichever is missing. */
export async function ensureBinaries(options: EnsureOptions = {}): Promise<BinaryPaths> {
  // One after the other: each `go install` already uses every core.
  const temporal = await ensureBinary('temporal', options);
  const minio = await ensureBinary('minio', options);
  return { temporal, minio };
}

/** The Temporal server and its schema tool, for the cluster test. */
export async function ensureClusterBinaries(
  options: EnsureOptions = {},
): Promise<Record<'server' | 'sqlTool', string>> {
  const server = await ensureBinary('temporal-server', options);
  const sqlTool = await ensureBinary('temporal-sql-tool', options);
  return { server, sqlTool };
}

function onPath(name: string, env: NodeJS.ProcessEnv): string | undefined {
  for (const dir of (env.PATH ?? '').split(path.delimiter).filter(Boolean)) {
    const file = path.join(dir, name);
    if (isExecutable(file)) return file;
  }
  return undefined;
}

/**
 * Path of one binary: the one its variable names, else (for the Temporal CLI) the
 * one on PATH, else ours from the cache, building it with `go install` if needed.
 */
export async function ensureBinary(name: BinaryName, options: EnsureOptions = {}): Promise<string> {
  const env = options.env ?? process.env;
  const log = options.log ?? defaultLog;
  const spec: BinarySpec = BINARIES[name];
  const override = env[spec.envOverride];
  if (override) {
    if (!isExecutable(override)) throw new Error(`${spec.envOverride}=${override} is not an executable file`);
    return override;
  }
  const found = spec.fromPath ? onPath(name, env) : undefined;
  if (found) return found;
  const dir = binDir(env);
  const target = path.join(dir, name);
  if (isExecutable(target)) return target;

  fs.mkdirSync(dir, { recursive: true });
  const release = await acquireLock(path.join(dir, `.${name}.lock`), name, log, options.lockTimeoutMs ?? 30 * 60_000);
  try {
    // Another process may have finished the build while we waited for the lock.
    if (isExecutable(target)) return target;
    await goInstall(name, dir, target, env, log);
    return target;
  } finally {
    release();
  }
}

function checkGo(dir: string, env: NodeJS.ProcessEnv): string {
  const result = spawnSync('go', ['env', 'GOVERSION'], { env, encoding: 'utf8' });
  if (result.error) throw new GoMissingError(dir, `\`go\` is not on PATH: ${result.error.message}`);
  const version = result.stdout.trim();
  const match = /^go(\d+)\.(\d+)/.exec(version);
  // Go >= 1.21 fetches a newer toolchain by itself when a module asks for one.
  if (!match || Number(match[1]) < 1 || (Number(match[1]) === 1 && Number(match[2]) < 21)) {
    throw new GoMissingError(dir, `found ${version || 'an unknown Go version'}`);
  }
  return version;
}

async function goInstall(
  name: BinaryName,
  dir: string,
  target: string,
  env: NodeJS.ProcessEnv,
  log: (line: string) => void,
): Promise<void> {
  const goVersion = checkGo(dir, env);
  const spec = `${BINARIES[name].pkg}@${BINARIES[name].version}`;
  // Build into a private directory and rename, so nobody ever sees a half-written binary.
  const staging = fs.mkdtempSync(path.join(dir, `.build-${name}-`));
  const started = Date.now();
  log(`stasis: building ${name} (${spec}) with ${goVersion} into ${dir}`);
  log('stasis: this takes several minutes, once per machine');
  const heartbeat = setInterval(() => {
    log(`stasis: still building ${name} (${Math.round((Date.now() - started) / 1000)} s)`);
  }, 30_000);
  const tail: string[] = [];
  try {
    const child = spawn('go', ['install', spec], {
      env: { ...env, GOBIN: staging },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    for (const stream of [child.stdout, child.stderr]) {
      readline.createInterface({ input: stream }).on('line', (line) => {
        tail.push(line);
        if (tail.length > 30) tail.shift();
        log(`  [go ${name}] ${line}`);
      });
    }
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject);
      child.once('close', resolve);
    });
    const built = path.join(staging, (BINARIES[name] as BinarySpec).output ?? name);
    if (code !== 0 || !isExecutable(built)) {
      throw new Error(`go install ${spec} failed (exit ${code}):\n${tail.join('\n')}`);
    }
    fs.renameSync(built, target);
    log(`stasis: built ${target} in ${Math.round((Date.now() - started) / 1000)} s`);
  } finally {
    clearInterval(heartbeat);
    fs.rmSync(staging, { recursive: true, force: true });
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function readLock(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
}

/**
 * An O_EXCL lock file holding the builder's pid. A lock whose pid is gone is
 * stale (a builder that crashed) and is taken over.
 */
async function acquireLock(
  file: string,
  name: BinaryName,
  log: (line: string) => void,
  timeoutMs: number,
): Promise<() => void> {
  const deadline = Date.now() + timeoutMs;
  let announced = false;
  for (;;) {
    try {
      const fd = fs.openSync(file, 'wx');
      fs.writeSync(fd, String(process.pid));
      fs.closeSync(fd);
      return () => fs.rmSync(file, { force: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    const content = readLock(file);
    if (content === undefined) continue; // released just now
    const holder = Number.parseInt(content, 10);
    if (!Number.isInteger(holder) || !pidAlive(holder)) {
      // Empty content may be a holder between open and write; give it a moment first.
      await new Promise((resolve) => setTimeout(resolve, 200));
      if (readLock(file) === content) fs.rmSync(file, { force: true });
      continue;
    }
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for process ${holder} to finish building ${name} (${file})`);
    if (!announced) {
      log(`stasis: waiting for process ${holder}, which is building ${name}`);
      announced = true;
    }
    await new Promise((resolve) => setTimeout(resolve, 1_000));
  }
}
