import { execFileSync } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { spawnGroup, stopGroup } from '../../platform/process-group';
import { portAnswers } from '../../platform/ports';
import { logTail, retryUntil } from '../../platform/wait';

// A throw-away PostgreSQL cluster from the Debian package (initdb, then postgres
// in the foreground in its own process group, so the harness stops it like every
// other server). PostgreSQL refuses to run as root: as root it runs as `nobody`.

export interface Postgres {
  port: number;
  user: string;
  password: string;
  stop(): Promise<void>;
}

/** The newest installed server binaries, e.g. /usr/lib/postgresql/15/bin. */
export function postgresBinDir(): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => existsSync(path.join(root, v, 'bin', 'initdb')))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (versions.length === 0) throw new Error('PostgreSQL is not installed: apt-get install postgresql');
  return path.join(root, versions[0], 'bin');
}

/** Runs as `nobody` when we are root (PostgreSQL refuses root), else as ourselves. */
function asUnprivileged(command: string, args: string[]): [string, string[]] {
  if (process.getuid?.() !== 0) return [command, args];
  return ['setpriv', ['--reuid=nobody', '--regid=nogroup', '--clear-groups', '--', command, ...args]];
}

function nobodyIds(): { uid: number; gid: number } {
  const uid = Number(execFileSync('id', ['-u', 'nobody'], { encoding: 'utf8' }).trim());
  const gid = Number(execFileSync('getent', ['group', 'nogroup'], { encoding: 'utf8' }).split(':')[2]);
  return { uid, gid };
}

/** `dir` is PostgreSQL's own; as root, `nobody` must be able to pass through its parents. */
export async function startPostgres(dir: string, port: number): Promise<Postgres> {
  const bin = postgresBinDir();
  const data = path.join(dir, 'data');
  const sockets = path.join(dir, 'sockets');
  mkdirSync(data, { recursive: true, mode: 0o700 });
  mkdirSync(sockets, { recursive: true });
  const user = 'temporal';
  const password = 'temporal';
  if (process.getuid?.() === 0) {
    const { uid, gid } = nobodyIds();
    for (const d of [dir, data, sockets]) chownSync(d, uid, gid);
  }
  const pwfile = path.join(dir, 'pwfile');
  writeFileSync(pwfile, `${password}\n`, { mode: 0o644 });
  const [initdb, initArgs] = asUnprivileged(path.join(bin, 'initdb'), [
    '-D',
    data,
    '-U',
    user,
    `--pwfile=${pwfile}`,
    '--auth=scram-sha-256',
    '--encoding=UTF8',
    '--no-sync',
  ]);
  execFileSync(initdb, initArgs, { stdio: ['ignore', 'ignore', 'pipe'] });
  const logFile = path.join(dir, 'postgres.log');
  const [postgres, args] = asUnprivileged(path.join(bin, 'postgres'), [
    '-D',
    data,
    '-p',
    String(port),
    '-k',
    sockets,
    '-c',
    'listen_addresses=127.0.0.1',
    // A test database: durability against power loss is not what is tested here.
    '-c',
    'fsync=off',
    '-c',
    'synchronous_commit=off',
    '-c',
    'max_connections=200',
  ]);
  const child = spawnGroup(postgres, args, { logFile });
  const stop = (): Promise<void> => stopGroup(child.pid, 20_000);
  try {
    await retryUntil(
      `PostgreSQL on 127.0.0.1:${port}`,
      60_000,
      () => (child.hasExited() ? `postgres exited; log ${logFile}:\n${logTail(logFile)}` : undefined),
      async () => {
        if (!(await portAnswers('127.0.0.1', port))) throw new Error('not listening yet');
      },
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { port, user, password, stop };
}
