import { mkdtempSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../../common/config';
import type { SandboxProvider } from '../../providers/api';
import { createStasisWorker } from '../../workers/worker';

const config = () =>
  loadConfig({
    ...process.env,
    STASIS_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), 'worker-start-')),
    STASIS_TASK_QUEUE: 'never-polled',
  });

test('a provider declaring apiVersion 2 stops the worker start with an error naming it', async () => {
  const legacy = { apiVersion: 2, name: 'legacy-cloud' } as unknown as SandboxProvider;
  await expect(createStasisWorker({ config: config(), providers: [legacy] })).rejects.toThrow(
    /legacy-cloud.*apiVersion 2.*v3/,
  );
});

test('a provider module loaded by path (STASIS_PROVIDERS) without apiVersion is refused, naming the module', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'provider-module-'));
  const modulePath = path.join(dir, 'old-provider.js');
  writeFileSync(modulePath, "module.exports = { provider: { name: 'old-style', release() {} } };");
  await expect(createStasisWorker({ config: { ...config(), STASIS_PROVIDERS: modulePath } })).rejects.toThrow(
    /old-style.*no apiVersion/,
  );
});
