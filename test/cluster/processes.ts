import { spawn, type ChildProcess } from 'node:child_process';
import { openSync, readFileSync } from 'node:fs';
import { once } from 'node:events';
import * as path from 'node:path';

// Stasis processes of the cluster test: the real `stasis worker` and `stasis api`
// commands (TypeScript run through swc, as the CLI tests do), each with only the
// environment a deployment would give it.

const ROOT = path.resolve(__dirname, '..', '..');

export interface StasisProcess {
  name: string;
  child: ChildProcess;
  logFile: string;
  exited: Promise<unknown>;
}

/** PATH and the like, without any TEMPORAL_* or STASIS_* of the shell that runs the test. */
export function baseEnv(): Record<string, string> {
  const keep = ['PATH', 'HOME', 'LANG', 'TMPDIR', 'GOCACHE', 'GOPATH', 'STASIS_CACHE_DIR'];
  return Object.fromEntries(keep.flatMap((k) => (process.env[k] ? [[k, process.env[k] as string]] : [])));
}

/** Starts `stasis <command>` and resolves once it printed `ready` on stdout. */
export async function startStasis(
  name: string,
  command: string,
  env: Record<string, string>,
  logDir: string,
  ready: string,
  timeoutMs = 400_000,
): Promise<StasisProcess> {
  const logFile = path.join(logDir, `${name}.log`);
  const log = openSync(logFile, 'a');
  const child = spawn(
    process.execPath,
    ['-r', path.join(ROOT, 'scripts', 'register-ts.js'), path.join(ROOT, 'cli', 'main.ts'), command],
    {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', log],
    },
  );
  const exited = once(child, 'exit');
  let seen = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${name} did not start in ${timeoutMs / 1000} s; see ${logFile}`)),
      timeoutMs,
    );
    child.stdout?.on('data', (chunk: Buffer) => {
      seen += chunk.toString();
      if (seen.includes(ready)) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(
        new Error(
          `${name} exited (${code ?? signal}) before it was ready:\n${readFileSync(logFile, 'utf8').slice(-3000)}`,
        ),
      );
    });
  });
  child.stdout?.resume();
  return { name, child, logFile, exited };
}

export async function sigkill(p: StasisProcess): Promise<void> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return;
  p.child.kill('SIGKILL');
  await p.exited;
}

/** SIGTERM: the commands stop their workers and servers in order. */
export async function terminate(p: StasisProcess, graceMs = 60_000): Promise<void> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return;
  p.child.kill('SIGTERM');
  const timer = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
  await p.exited;
  clearTimeout(timer);
}
