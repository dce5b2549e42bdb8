import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { ProviderDeps } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';
import { createDefaultRegistry, ProviderRegistry } from '../../providers/registry';
import { FsCheckpointStore } from '../../stores/fs';
import { stasisError, tempDir } from './helpers';

// The provider registry: plugin API v3 only, checked when the worker starts.

const METHODS = [
  'provision',
  'attach',
  'start',
  'exec',
  'stop',
  'pause',
  'resume',
  'restore',
  'destroy',
  'readFile',
  'writeFile',
  'release',
  'processCount',
  'listSandboxes',
  'close',
];

/** The source of a provider module (CommonJS, as a compiled plugin would be). */
function moduleSource(exportName: 'default' | 'provider', fields: Record<string, unknown>, factory = false): string {
  const methods = METHODS.map((m) => `${m}: async () => undefined`).join(', ');
  const object = `{ ...${JSON.stringify(fields)}, capabilities: { pauseModes: ['DETACH'], pause: false, crossHostRestore: false }, ${methods} }`;
  const value = factory
    ? `(deps) => ({ ...${object}, name: ${JSON.stringify(fields.name)} + '@' + deps.hostId })`
    : object;
  return `exports.${exportName} = ${value};\n`;
}

async function deps(): Promise<ProviderDeps> {
  const dataDir = await tempDir('registry');
  return { hostId: 'h1', dataDir, store: new FsCheckpointStore(path.join(dataDir, 'store')) };
}

async function writeModule(name: string, source: string): Promise<string> {
  const file = path.join(await tempDir('plugin'), `${name}.js`);
  await fs.writeFile(file, source);
  return file;
}

describe('ProviderRegistry', () => {
  it('has the built-in local and bwrap providers and loads extra modules by path', async () => {
    const factoryModule = await writeModule(
      'factory',
      moduleSource('default', { apiVersion: 3, name: 'remote' }, true),
    );
    const objectModule = await writeModule('object', moduleSource('provider', { apiVersion: 3, name: 'static' }));
    const registry = createDefaultRegistry(await deps(), [factoryModule, objectModule]);
    expect(registry.names()).toEqual(['local', 'bwrap', 'remote@h1', 'static']);
    expect(registry.get('local').capabilities.pauseModes).toContain('SNAPSHOT_AND_TERMINATE');
    const err = await stasisError(
      Promise.resolve().then(() => registry.get('docker')),
      'NOT_FOUND',
    );
    expect(err.message).toContain('"docker"');
  });

  it('rejects a v2 provider object, naming it, with no fallback', async () => {
    const registry = new ProviderRegistry(await deps());
    const v2 = { ...createLocalProvider(await deps()), apiVersion: 2, name: 'legacy-sdk' };
    expect(() => registry.register(v2 as unknown as Parameters<ProviderRegistry['register']>[0])).toThrow(
      /provider "legacy-sdk" \(provider\) declares apiVersion 2: only sandbox plugin API v3 providers are supported/,
    );
    expect(registry.names()).toEqual([]);
  });

  it('rejects modules without apiVersion or with v2, naming the provider or its path', async () => {
    const registry = new ProviderRegistry(await deps());
    const unnamed = await writeModule('unnamed', moduleSource('default', {}));
    expect(() => registry.load(unnamed)).toThrow(`${unnamed} declares no apiVersion`);
    const v2 = await writeModule('v2', moduleSource('default', { apiVersion: 2, name: 'old-docker' }));
    expect(() => registry.load(v2)).toThrow(`provider "old-docker" (${v2}) declares apiVersion 2`);
    const noExport = await writeModule('none', 'exports.somethingElse = 1;\n');
    expect(() => registry.load(noExport)).toThrow('exports neither `default` nor `provider`');
  });

  it('names every missing or malformed member of a v3 provider', async () => {
    const registry = new ProviderRegistry(await deps());
    const { release: _release, ...withoutRelease } = createLocalProvider(await deps());
    expect(() =>
      registry.register({ ...withoutRelease, name: 'half' } as unknown as Parameters<ProviderRegistry['register']>[0]),
    ).toThrow(/provider "half" \(provider\) is not a valid plugin API v3 provider: release: must be a function/);
    registry.register(createLocalProvider);
    expect(() => registry.register(createLocalProvider, 'again')).toThrow(
      'provider "local" (again) is registered twice',
    );
  });
});
