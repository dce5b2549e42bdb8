// The sandbox-provider API v3 (`stasis/providers`): what a provider module exports and
// every request and receipt that crosses it.

export * from '../providers/api';
export type { CheckpointStore } from '../stores/api';
