import { randomUUID } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { ExecOutcome } from './api';
import { bubblewrapCommands } from './bwrap';
import { hostCommands, SHELL_FROM_STDIN, spawnInSandbox, waitForOutcome, type CommandWrapper } from './command';
import { hasErrorCode } from '../stores/atomic-file';
import { removeTree } from './files';
import { DEFAULT_LIMITS } from './limits';
import { killSandbox, markerEnv } from './processes';
import type { SandboxPaths } from './sandbox-state';

// An EXTERNAL job runs beside a Run's sandbox, never in it, so it never holds the
// sandbox's compute. Its command is still the agent's: it runs in a throwaway sandbox of
// its own, through the process starter, with no more of the host than a sandbox of the
// Run's provider would have. A `local` Run's job runs as a plain process (a local sandbox
// is no isolation boundary either); any other provider's runs inside bubblewrap: its own
// pid namespace, a read-only system, an empty workspace and home, no capability, and the
// host's network (calling services is what such a job is for). Either way it takes the
// default sandbox limits, it never sees the worker's environment, and every process it
// leaves behind is killed and its directory removed when it ends.

/** Directory under a host's data dir where EXTERNAL jobs get their throwaway workspaces. */
export const EXTERNAL_JOBS_DIR = 'external';

export interface ExternalJobRequest {
  command: string;
  env?: Record<string, string>;
  /** The Run's sandbox provider; unknown or absent means the strict jail (bubblewrap). */
  provider?: string;
  /** Cancels the job: its whole process group is killed. */
  signal?: AbortSignal;
  timeoutMs?: number;
}

export interface ExternalJobHost {
  hostId: string;
  /** The host's data dir; jobs work in `<dataDir>/external/<id>`. */
  dataDir: string;
  /** For tests and hosts with bubblewrap elsewhere: how to jail a job; chosen by provider otherwise. */
  wrapper?: (provider: string | undefined) => CommandWrapper;
}

let bubblewrap: CommandWrapper | undefined;
const jailFor = (provider: string | undefined): CommandWrapper =>
  provider === 'local' ? hostCommands : (bubblewrap ??= bubblewrapCommands(undefined, { network: true }));

/** Largest output kept per stream while the job runs (the result keeps its tail). */
const MAX_OUTPUT_BYTES = 1024 * 1024;

export async function runExternalJob(host: ExternalJobHost, request: ExternalJobRequest): Promise<ExecOutcome> {
  const wrapper = (host.wrapper ?? jailFor)(request.provider);
  await wrapper.check();
  const id = `ext-${randomUUID()}`;
  const root = path.join(host.dataDir, EXTERNAL_JOBS_DIR, id);
  const paths: SandboxPaths = {
    root,
    // A job's files live only as long as the job: no volume of their own.
    volume: root,
    volumeImage: path.join(root, 'volume.img'),
    workspace: path.join(root, 'workspace'),
    home: path.join(root, 'home'),
    envs: path.join(root, 'envs'),
    meta: path.join(root, 'meta'),
    stateFile: path.join(root, 'meta', 'state.json'),
    receipts: path.join(root, 'meta', 'receipts'),
    jobs: path.join(root, 'meta', 'jobs'),
  };
  for (const dir of [paths.workspace, paths.home, paths.envs]) await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  const marker = { sandboxId: id, hostId: host.hostId };
  try {
    const child = await spawnInSandbox(wrapper, paths, SHELL_FROM_STDIN, {
      env: { ...request.env, ...markerEnv(marker) },
      sandbox: { marker, limits: DEFAULT_LIMITS },
      stdin: request.command,
      maxOutputBytes: MAX_OUTPUT_BYTES,
    });
    return await waitForOutcome(child, {
      ...(request.timeoutMs ? { timeoutMs: request.timeoutMs } : {}),
      ...(request.signal ? { signal: request.signal } : {}),
    });
  } finally {
    // What the job started in the background ends with it; its files go (links in them are not followed).
    await killSandbox(marker);
    await removeTree(root);
  }
}

/**
 * What jobs of an earlier worker process on this host left when it died: their processes are
 * killed and their directories removed. Called at worker start, before any job runs.
 */
export async function sweepExternalJobs(host: ExternalJobHost): Promise<void> {
  const dir = path.join(host.dataDir, EXTERNAL_JOBS_DIR);
  const names = await fs.readdir(dir).catch((err: unknown) => {
    if (hasErrorCode(err, 'ENOENT')) return [];
    throw err;
  });
  for (const name of names) {
    await killSandbox({ sandboxId: name, hostId: host.hostId });
    await removeTree(path.join(dir, name));
  }
}
