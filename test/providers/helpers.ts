import { createHash } from 'node:crypto';
import { createReadStream, readdirSync, readFileSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { RequestContext } from '../../providers/api';
import { StasisError, type ErrorCode } from '../../common/errors';
import { S3CheckpointStore } from '../../stores/s3';

// Shared by the provider and store tests: temp dirs, a real S3 store from the
// environment the jest global setup exports, and a manifest of a directory tree.

export async function tempDir(prefix: string): Promise<string> {
  return fs.mkdtemp(path.join(os.tmpdir(), `stasis-${prefix}-`));
}

export function uniqueId(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

/**
 * The MinIO (or other S3) store the global setup started; the tests need a real one. `endpoint`: the same
 * store reached another way (a fault proxy in front of it).
 */
export function s3StoreFromEnv(partSizeBytes?: number, endpoint = process.env.STASIS_S3_ENDPOINT): S3CheckpointStore {
  const accessKeyId = process.env.AWS_ACCESS_KEY_ID;
  const secretAccessKey = process.env.AWS_SECRET_ACCESS_KEY;
  if (!endpoint || !accessKeyId || !secretAccessKey) {
    throw new Error(
      'STASIS_S3_ENDPOINT, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set (the jest global setup starts MinIO)',
    );
  }
  return new S3CheckpointStore({
    endpoint,
    bucket: process.env.STASIS_S3_BUCKET ?? 'stasis',
    region: process.env.STASIS_S3_REGION ?? 'us-east-1',
    credentials: { accessKeyId, secretAccessKey },
    ...(partSizeBytes ? { partSizeBytes } : {}),
  });
}

export function context(overrides: Partial<RequestContext> = {}): RequestContext {
  return { ownerId: 'test-owner', hostId: 'test-host', ...overrides };
}

export async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

/** Resolves to the StasisError `promise` rejects with, failing the test if it resolves or rejects otherwise. */
export async function stasisError(promise: Promise<unknown>, code: ErrorCode): Promise<StasisError> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof StasisError && err.code === code) return err;
    throw new Error(
      `expected StasisError ${code}, got ${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}`,
      { cause: err },
    );
  }
  throw new Error(`expected StasisError ${code}, but the call succeeded`);
}

export async function sha256File(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/**
 * One line per path under `root`: type, mode, and content hash (files), link
 * target (symlinks) or nothing (dirs); files also carry their mtime in seconds.
 */
export async function manifest(root: string): Promise<string[]> {
  const lines: string[] = [];
  async function walk(dir: string): Promise<void> {
    const names = (await fs.readdir(dir)).sort();
    for (const name of names) {
      const full = path.join(dir, name);
      const rel = path.relative(root, full);
      const stat = await fs.lstat(full);
      const mode = (stat.mode & 0o7777).toString(8);
      if (stat.isSymbolicLink()) lines.push(`link ${rel} -> ${await fs.readlink(full)}`);
      else if (stat.isDirectory()) {
        lines.push(`dir ${rel} ${mode}`);
        await walk(full);
      } else if (stat.isFile()) {
        lines.push(`file ${rel} ${mode} ${stat.size} ${Math.floor(stat.mtimeMs / 1000)} ${await sha256File(full)}`);
      } else lines.push(`other ${rel}`);
    }
  }
  await walk(root);
  return lines;
}

/** Every path under `dir`, to show nothing was written somewhere. */
export async function listTree(dir: string): Promise<string[]> {
  const entries = await fs.readdir(dir, { recursive: true });
  return entries.map(String).sort();
}

/** Perl that exchanges the paths in `$a` and `$b` atomically (renameat2 RENAME_EXCHANGE), for ever. */
const EXCHANGE_FOREVER = [
  'my $renameat2 = $Config{archname} =~ /aarch64/ ? 276 : 316;',
  'while (1) { syscall($renameat2, -100, $a, -100, $b, 2) == 0 or die "renameat2: $!"; }',
].join(' ');

/** The argv of a process that exchanges `a` and `b` (both must exist) as fast as it can, for ever. */
export function exchangeLoop(a: string, b: string): string[] {
  return ['perl', '-MConfig', '-e', `my ($a, $b) = @ARGV; ${EXCHANGE_FOREVER}`, a, b];
}

/**
 * The argv of an attacker: from its working directory, it swaps the directory
 * `name` and a link to `target` (made here as `name.link`) under `name`, as fast
 * as it can, for ever. The swap is atomic (renameat2 RENAME_EXCHANGE), so
 * `name` is always there, as one or the other. Runs on the host, or inside a
 * sandbox (perl is in /usr).
 */
export function swapLoop(name: string, target: string): string[] {
  const script = [
    'my ($n, $t) = @ARGV; my $l = "$n.link"; mkdir $n; symlink $t, $l or die "symlink: $!";',
    'my ($a, $b) = ($n, $l);',
    EXCHANGE_FOREVER,
  ].join(' ');
  return ['perl', '-MConfig', '-e', script, name, target];
}

/** Resolves once `file` has been seen both as a directory and as a link: the swap runs. */
export async function swapping(file: string): Promise<void> {
  const seen = new Set<string>();
  await waitFor(
    `${file} to be swapped`,
    async () => {
      const stat = await fs.lstat(file).catch(() => undefined);
      if (stat?.isDirectory()) seen.add('dir');
      if (stat?.isSymbolicLink()) seen.add('link');
      return seen.size === 2;
    },
    60_000,
  );
}

/** Host pids whose command line is exactly `argv`. */
export function pidsRunning(argv: string[]): number[] {
  const wanted = `${argv.join('\0')}\0`;
  return readdirSync('/proc')
    .filter((name) => /^[0-9]+$/.test(name))
    .filter((name) => {
      try {
        return readFileSync(`/proc/${name}/cmdline`, 'latin1') === wanted;
      } catch {
        return false;
      }
    })
    .map(Number);
}

/** Mount points on this host under `dir`, deepest last (as mounted). */
export function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point.startsWith(`${dir}/`));
}
