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

/** Where a cross-host restore stops inside its work (restore-kill.test.ts). */
export type RestorePoint = 'restore:mid-download' | 'restore:mid-extract' | 'restore:between-swap-renames';
export const INSIDE_RESTORE_POINTS: RestorePoint[] = [
  'restore:mid-download',
  'restore:mid-extract',
  'restore:between-swap-renames',
];

/** Where a resume from the local copy stops: the sandbox's compute started, the call not yet answered (resume-kill.test.ts). */
export type ResumePoint = 'resume:after-start';

/** Multipart parts of 5 MiB (the S3 minimum), so a workspace of a few parts is uploaded in several requests. */
export const PART_BYTES = 5 * 1024 * 1024;
/** Where a mid-upload stop happens: after the first part has gone out. */
export const MID_UPLOAD_BYTES = PART_BYTES + 1024 * 1024;
