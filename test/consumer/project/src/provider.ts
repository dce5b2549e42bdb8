import { spawn } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import * as path from 'node:path';
import type {
  ExecOutcome,
  FencedRequest,
  FileRequest,
  ProviderDeps,
  ProviderExecRequest,
  ProvisionRequest,
  RestoreResult,
  SandboxProvider,
  SandboxReleaseReceipt,
} from 'stasis/providers';

// The consumer's own sandbox provider: a directory per sandbox, commands run in it by `sh`.
// It cannot pause or release (no pause modes), so Runs keep their sandbox until they end.

export function createDirProvider(deps: ProviderDeps): SandboxProvider {
  const root = path.join(deps.dataDir, 'consumer-dirs');
  const dirOf = (sandboxId: string) => path.join(root, sandboxId.replace(/[^A-Za-z0-9._-]/g, '_'));
  const inside = (request: FileRequest) => {
    const file = path.resolve(dirOf(request.sandboxId), request.path);
    if (!file.startsWith(dirOf(request.sandboxId) + path.sep))
      throw new Error(`${request.path} is outside the sandbox`);
    return file;
  };
  const unsupported = (what: string) => () => Promise.reject(new Error(`consumer-dirs cannot ${what}`));
  const nothing = async (_request: FencedRequest) => undefined;

  return {
    apiVersion: 3,
    name: 'consumer-dirs',
    capabilities: { pauseModes: [], pause: false, crossHostRestore: false },
    async provision(request: ProvisionRequest) {
      await mkdir(dirOf(request.sandboxId), { recursive: true });
    },
    attach: nothing,
    start: nothing,
    stop: nothing,
    pause: unsupported('pause'),
    resume: unsupported('resume'),
    restore: unsupported('restore') as () => Promise<RestoreResult>,
    release: unsupported('release') as () => Promise<SandboxReleaseReceipt>,
    exec(request: ProviderExecRequest): Promise<ExecOutcome> {
      return new Promise((resolve, reject) => {
        const child = spawn('sh', ['-c', request.command], {
          cwd: dirOf(request.sandboxId),
          env: { PATH: process.env.PATH ?? '/usr/bin:/bin', CONSUMER_PROVIDER: 'consumer-dirs' },
        });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
        child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
        child.once('error', reject);
        child.once('close', (code) => resolve({ exitCode: code ?? 1, stdout, stderr }));
      });
    },
    async destroy(request: FencedRequest) {
      await rm(dirOf(request.sandboxId), { recursive: true, force: true });
    },
    readFile: (request: FileRequest) => readFile(inside(request)),
    writeFile: (request: FileRequest & { content: Buffer }) => writeFile(inside(request), request.content),
    processCount: async () => 0,
    listSandboxes: async () => [],
    close: async () => undefined,
  };
}
