// The worker factory (`stasis/worker`): the Temporal workers of one host, with the
// given drivers and providers. `stasis worker` and `stasis dev` are built on it.

export { createStasisWorker, workflowBundle, type StasisWorker, type StasisWorkerOptions } from '../workers/worker';
export { loadConfig, ConfigError, type Config } from '../common/config';
export * from './drivers';
export * from './providers';
