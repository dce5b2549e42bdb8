// The package's main entry (`import … from 'stasis'`): the typed client, the wire
// schemas and types, and the plugin APIs for agent drivers and sandbox providers.
// It loads no worker SDK; the worker factory is `stasis/worker`.

export { StasisClient, RunsApi, SandboxesApi, type StasisClientOptions } from '../client';
export { clientOptions } from '../client/options';
// The types StasisClientOptions names, so a platform can write its options out.
export type { WorkerMetricsSource } from '../client/metrics';
export type { HostPathPolicy } from '../common/host-paths';
export type { TemporalConnectionOptions } from '../common/temporal-connection';
export type { HostFigures } from '../stores/figures';
export { loadConfig, ConfigError, type Config } from '../common/config';
export { StasisError, ERROR_STATUS, isErrorCode, type ErrorCode } from '../common/errors';
export * from '../common/schemas';
export * from './drivers';
export * from './providers';
