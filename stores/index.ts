import * as path from 'node:path';
import type { Config } from '../common/config';
import type { CheckpointStore } from './api';
import { FsCheckpointStore } from './fs';
import { S3CheckpointStore } from './s3';

export type { CheckpointStore, DownloadCheck, StoredObject } from './api';
export { FsCheckpointStore } from './fs';
export { S3CheckpointStore, type S3StoreOptions } from './s3';

/** The checkpoint store the configuration selects: S3 when an endpoint (or `STASIS_SNAPSHOT_STORE=s3`) is set, else a directory. */
export function createCheckpointStore(config: Config): CheckpointStore {
  if (config.snapshotStore === 'fs')
    return new FsCheckpointStore(path.join(config.STASIS_DATA_DIR, 'checkpoints-store'));
  const { AWS_ACCESS_KEY_ID: accessKeyId, AWS_SECRET_ACCESS_KEY: secretAccessKey } = config;
  return new S3CheckpointStore({
    bucket: config.STASIS_S3_BUCKET,
    region: config.STASIS_S3_REGION,
    ...(config.STASIS_S3_ENDPOINT ? { endpoint: config.STASIS_S3_ENDPOINT } : {}),
    ...(accessKeyId && secretAccessKey ? { credentials: { accessKeyId, secretAccessKey } } : {}),
  });
}
