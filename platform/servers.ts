// The local servers Stasis needs — the Temporal dev server and MinIO — for
// `stasis dev` and the jest global setup, which share this one module.
export { startTemporal, waitForTemporal } from './temporal-server';
export type { TemporalOptions, TemporalServer } from './temporal-server';
export { ensureBucket, minioFromState, startMinio } from './minio-server';
export type { MinioOptions, MinioServer, MinioServerControl, MinioState } from './minio-server';
export { freePort, freePorts, portAnswers } from './ports';
export { isAlive, spawnGroup, stopGroup } from './process-group';
export type { GroupProcess, SpawnGroupOptions } from './process-group';
