import type { ProviderDeps, SandboxProvider } from '../../providers/api';
import { createLocalProvider } from '../../providers/local';

/** The local provider under another name, advertising no pause and no release mode: pause is 501, Runs keep it RETAINED. */
export const noPauseProvider = (deps: ProviderDeps): SandboxProvider => ({
  ...createLocalProvider(deps, { name: 'nopause' }),
  capabilities: { pauseModes: [], pause: false, crossHostRestore: false },
});
