import type { MinioServer, TemporalServer } from '../platform/servers';

// What the global setup started, kept on globalThis for the global teardown
// (both run in jest's parent process; test workers see only process.env).

export interface TestServers {
  dataDir: string;
  minioStateFile: string;
  temporal?: TemporalServer;
  minio?: MinioServer;
  /** process.env values the setup replaced, restored by the teardown (matters in watch mode). */
  replacedEnv: Record<string, string | undefined>;
}

const KEY = '__stasisTestServers';

export function saveTestServers(servers: TestServers): void {
  (globalThis as Record<string, unknown>)[KEY] = servers;
}

export function takeTestServers(): TestServers | undefined {
  const servers = (globalThis as Record<string, unknown>)[KEY] as TestServers | undefined;
  delete (globalThis as Record<string, unknown>)[KEY];
  return servers;
}
