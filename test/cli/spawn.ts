import { spawn, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';

// The real `stasis` executable as a child process, run from the TypeScript
// sources (compiled on the fly by swc, as jest does): no build step needed.

const ROOT = path.join(__dirname, '..', '..');
export const CLI = {
  command: process.execPath,
  args: ['-r', path.join(ROOT, 'scripts', 'register-ts.js'), path.join(ROOT, 'cli', 'main.ts')],
  cwd: ROOT,
};

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `stasis <args>` to its end. */
export function runStasis(args: string[], env: NodeJS.ProcessEnv, timeoutMs = 60_000): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawnStasis(args, env);
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(
        new Error(`stasis ${args.join(' ')} did not finish in ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`),
      );
    }, timeoutMs);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Starts `stasis <args>` and leaves it running (dev, api, mcp). */
export function spawnStasis(args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  return spawn(CLI.command, [...CLI.args, ...args], { cwd: CLI.cwd, env, stdio: ['pipe', 'pipe', 'pipe'] });
}
