import * as path from 'node:path';
import { describeIssues, StasisError } from '../common/errors';
import { ProviderShape, type ProviderDeps, type ProviderModuleExport, type SandboxProvider } from './api';
import { createBwrapProvider } from './bwrap';
import { createLocalProvider } from './local';

// The providers a worker serves, by name. Each is checked against plugin API v3
// when the worker starts; a v2 (or unversioned) provider stops the start-up with
// an error naming it: there is no compatibility fallback.

export class ProviderRegistry {
  private readonly providers = new Map<string, SandboxProvider>();

  constructor(private readonly deps: ProviderDeps) {}

  /** Adds a provider object, or the provider a factory builds from this worker's dependencies. */
  register(source: ProviderModuleExport, origin = 'provider'): SandboxProvider {
    const candidate: unknown = typeof source === 'function' ? source(this.deps) : source;
    const provider = validateProvider(candidate, origin);
    if (this.providers.has(provider.name)) {
      throw new StasisError(
        'INVALID_ARGUMENT',
        `provider ${JSON.stringify(provider.name)} (${origin}) is registered twice`,
      );
    }
    this.providers.set(provider.name, provider);
    return provider;
  }

  /** Loads a provider module by path; it exports the provider or its factory as `default` or `provider`. */
  load(modulePath: string): SandboxProvider {
    const resolved = path.resolve(modulePath);
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- provider modules are chosen at run time
    const loaded: unknown = require(resolved);
    const exported = pickExport(loaded);
    if (exported === undefined) {
      throw new StasisError(
        'INVALID_ARGUMENT',
        `provider module ${resolved} exports neither \`default\` nor \`provider\``,
      );
    }
    if (typeof exported !== 'function' && (typeof exported !== 'object' || exported === null)) {
      throw new StasisError(
        'INVALID_ARGUMENT',
        `provider module ${resolved}: its export is a ${typeof exported}, not a provider or a provider factory`,
      );
    }
    // Checked by validateProvider in register(): the export is only trusted after that.
    return this.register(exported as ProviderModuleExport, resolved);
  }

  get(name: string): SandboxProvider {
    const provider = this.providers.get(name);
    if (!provider) {
      throw new StasisError(
        'NOT_FOUND',
        `no sandbox provider named ${JSON.stringify(name)} on this worker (known: ${this.names().join(', ') || 'none'})`,
      );
    }
    return provider;
  }

  names(): string[] {
    return [...this.providers.keys()];
  }

  /** Closes every provider's client handles (never their sandboxes' compute). */
  async closeAll(): Promise<void> {
    await Promise.all([...this.providers.values()].map((provider) => provider.close()));
  }
}

/** A registry with the built-in `local` and `bwrap` providers plus the provider modules at `extraModulePaths`. */
export function createDefaultRegistry(deps: ProviderDeps, extraModulePaths: readonly string[] = []): ProviderRegistry {
  const registry = new ProviderRegistry(deps);
  registry.register(createLocalProvider, 'built-in local');
  registry.register(createBwrapProvider, 'built-in bwrap');
  for (const modulePath of extraModulePaths) registry.load(modulePath);
  return registry;
}

function pickExport(loaded: unknown): unknown {
  if (typeof loaded !== 'object' || loaded === null) return undefined;
  const module = loaded as { default?: unknown; provider?: unknown };
  return module.default ?? module.provider;
}

function validateProvider(candidate: unknown, origin: string): SandboxProvider {
  const record = typeof candidate === 'object' && candidate !== null ? (candidate as Record<string, unknown>) : {};
  const label =
    typeof record.name === 'string' && record.name ? `provider ${JSON.stringify(record.name)} (${origin})` : origin;
  if (record.apiVersion !== 3) {
    const version =
      record.apiVersion === undefined
        ? 'declares no apiVersion'
        : `declares apiVersion ${JSON.stringify(record.apiVersion)}`;
    throw new StasisError(
      'NOT_SUPPORTED',
      `${label} ${version}: only sandbox plugin API v3 providers are supported (v2 and older are rejected, there is no fallback)`,
    );
  }
  const parsed = ProviderShape.safeParse(candidate);
  if (!parsed.success)
    throw new StasisError(
      'INVALID_ARGUMENT',
      `${label} is not a valid plugin API v3 provider: ${describeIssues(parsed.error.issues)}`,
    );
  // ProviderShape checked every member; the object itself is kept so its methods keep their `this`.
  return candidate as SandboxProvider;
}
