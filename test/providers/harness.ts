import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { SandboxProvider } from '../../providers/api';
import { createLocalProvider, type LocalProviderOptions } from '../../providers/local';
import { killSandbox, scanSandboxProcesses } from '../../providers/processes';
import type { CheckpointStore } from '../../stores/api';
import { FsCheckpointStore } from '../../stores/fs';
import { context, tempDir, uniqueId } from './helpers';

// A provider on a throw-away host: its own data dir and host id, so parallel
// test files never see each other's processes. Everything it started is killed
// after the test file.

export interface Host {
  hostId: string;
  dataDir: string;
  store: CheckpointStore;
  provider: SandboxProvider;
  /** A fresh provider instance on the same data dir: the worker after a restart. */
  restart(): SandboxProvider;
  /** Provisions and starts a sandbox; returns its id. */
  sandbox(options?: { env?: Record<string, string>; hostPath?: string; start?: boolean }): Promise<string>;
}

const hostIds: string[] = [];

// Every process of every sandbox these hosts ran, restored copies included.
afterAll(async () => {
  for (const hostId of hostIds) {
    for (const sandboxId of (await scanSandboxProcesses(hostId)).keys()) {
      await killSandbox({ hostId, sandboxId }).catch(() => undefined);
    }
  }
});

export async function makeHost(
  options: {
    store?: CheckpointStore;
    make?: (deps: { hostId: string; dataDir: string; store: CheckpointStore }) => SandboxProvider;
    /** The host's data dir (a fresh temp dir by default). */
    dataDir?: string;
  } & LocalProviderOptions = {},
): Promise<Host> {
  const hostId = uniqueId('host');
  hostIds.push(hostId);
  const dataDir = options.dataDir ?? (await tempDir('host'));
  const store = options.store ?? new FsCheckpointStore(path.join(dataDir, 'store'));
  const make = () =>
    options.make ? options.make({ hostId, dataDir, store }) : createLocalProvider({ hostId, dataDir, store }, options);
  const host: Host = {
    hostId,
    dataDir,
    store,
    provider: make(),
    restart: make,
    async sandbox(sandboxOptions = {}) {
      const sandboxId = uniqueId('sbx');
      await host.provider.provision(
        {
          sandboxId,
          fence: 1,
          ...(sandboxOptions.env ? { env: sandboxOptions.env } : {}),
          ...(sandboxOptions.hostPath ? { workspace: { kind: 'active', hostPath: sandboxOptions.hostPath } } : {}),
        },
        context(),
      );
      if (sandboxOptions.start !== false) await host.provider.start({ sandboxId, fence: 1 }, context());
      return sandboxId;
    },
  };
  return host;
}

/** Runs a shell command in the sandbox at fence 1 and returns its stdout, failing on a non-zero exit. */
export async function sh(provider: SandboxProvider, sandboxId: string, command: string, fence = 1): Promise<string> {
  const outcome = await provider.exec({ sandboxId, fence, jobId: uniqueId('job'), command }, context());
  if (outcome.exitCode !== 0) throw new Error(`${command} exited ${outcome.exitCode}: ${outcome.stderr}`);
  return outcome.stdout;
}

/** Starts a loop that writes an increasing counter to `counter` in the workspace, detached from the exec. */
export async function startCounter(provider: SandboxProvider, sandboxId: string, fence = 1): Promise<void> {
  await sh(
    provider,
    sandboxId,
    `nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > counter; sleep 0.02; done' >/dev/null 2>&1 &`,
    fence,
  );
}

export async function readCounter(workspace: string, file = 'counter'): Promise<number> {
  return Number((await fs.readFile(path.join(workspace, file), 'utf8').catch(() => '0')).trim() || '0');
}

/** Releases sandbox `id` with a snapshot under `fence`, as a Run's suspend does. */
export function snapshotAndTerminate(provider: SandboxProvider, id: string, fence: number) {
  return provider.release(
    {
      sandboxId: id,
      idempotencyKey: `run/${id}/${fence}/release`,
      mode: 'SNAPSHOT_AND_TERMINATE',
      fence,
      reason: 'interaction',
    },
    context(),
  );
}
