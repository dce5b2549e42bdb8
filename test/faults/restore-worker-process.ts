import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import * as path from 'node:path';
import type { RestorePoint, ResumePoint } from './kill-points';

// Starts restore-kill-worker.ts (one provider restore in its own process, stopped at a point for a
// SIGKILL) and waits for its exit: shared by restore-kill.test.ts and resume-kill.test.ts.

const ROOT = path.join(__dirname, '..', '..');

export function runRestoreWorker(input: {
  dataDir: string;
  hostId: string;
  request: unknown;
  point?: RestorePoint | ResumePoint;
  marker: string;
}): ChildProcess {
  return spawn(
    process.execPath,
    ['-r', path.join(ROOT, 'scripts', 'register-ts.js'), path.join(__dirname, 'restore-kill-worker.ts')],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        RK_DATA_DIR: input.dataDir,
        RK_HOST_ID: input.hostId,
        RK_REQUEST: JSON.stringify(input.request),
        RK_MARKER: input.marker,
        // Past the first few MB of the download; past the first hundred files of the workspace.
        RK_DOWNLOAD_BYTES: String(4 * 1024 * 1024),
        RK_EXTRACT_FILES: '100',
        ...(input.point ? { RK_POINT: input.point } : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
}

/** The worker's exit: its code (null when killed by a signal) and what it wrote to stderr. */
export async function exitOf(child: ChildProcess): Promise<{ code: number | null; stderr: string }> {
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  child.stdout?.resume();
  const [code] = (await once(child, 'exit')) as [number | null];
  return { code, stderr };
}
