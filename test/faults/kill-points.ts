// Shared by the SIGKILL fault test and its worker process (kill-worker.ts).

/** Where a release or restore of a sandbox stops, for the test to SIGKILL the worker there. */
export type KillPoint =
  | 'release:before-snapshot'
  | 'release:mid-upload'
  | 'release:after-upload'
  | 'release:after-terminate'
  | 'restore:before'
  | 'restore:after';

export const RELEASE_POINTS: KillPoint[] = [
  'release:before-snapshot',
  'release:mid-upload',
  'release:after-upload',
  'release:after-terminate',
];
export const RESTORE_POINTS: KillPoint[] = ['restore:before', 'restore:after'];

/** Multipart parts of 5 MiB (the S3 minimum), so a workspace of a few parts is uploaded in several requests. */
export const PART_BYTES = 5 * 1024 * 1024;
/** Where a mid-upload stop happens: after the first part has gone out. */
export const MID_UPLOAD_BYTES = PART_BYTES + 1024 * 1024;
