import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as readline from 'node:readline';

// The Temporal CLI (embedded dev server) and MinIO, built once per machine with
// `go install` into a cache outside the repository, so fresh clones and CI runs
// on the same machine reuse them. This file imports only Node built-ins because
// scripts/ensure-binaries.js loads it without a build step.

export const BINARIES = {
  temporal: { pkg: 'github.com/temporalio/cli/cmd/temporal', version: 'v1.5.1', envOverride: 'STASIS_TEMPORAL_BIN' },
  // A pseudo-version: MinIO publishes no Go module tags; this is what @latest resolves to.
  minio: {
    pkg: 'github.com/minio/minio',
    version: 'v0.0.0-20260212201848-7aac2a2c5b7c',
    envOverride: 'STASIS_MINIO_BIN',
  },
} as const;

export type BinaryName = keyof typeof BINARIES;
export type BinaryPaths = Record<BinaryName, string>;

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
        'Install Go >= 1.24: https://go.dev/dl/ or the Debian package (apt-get install golang-go, ' +
        'trixie or bookworm-backports), then run again. Or point Stasis at servers you already run ' +
        'with TEMPORAL_ADDRESS and STASIS_S3_ENDPOINT.',
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

/** Path of one binary, building it with `go install` if it is not in the cache yet. */
export async function ensureBinary(name: BinaryName, options: EnsureOptions = {}): Promise<string> {
  const env = options.env ?? process.env;
  const log = options.log ?? defaultLog;
  const override = env[BINARIES[name].envOverride];
  if (override) {
    if (!isExecutable(override)) throw new Error(`${BINARIES[name].envOverride}=${override} is not an executable file`);
    return override;
  }
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
    const built = path.join(staging, name);
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
