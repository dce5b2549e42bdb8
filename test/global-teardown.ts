import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { minioFromState } from '../platform/servers';
import { mountsUnder } from './providers/helpers';
import { takeTestServers } from './servers-state';

// Stops what the global setup started, including a MinIO that a fault test
// restarted from a worker (its pid is only in the state file). The data dir
// is removed unless STASIS_TEST_KEEP_DATA=1 (then its logs/ help debugging).
export default async function globalTeardown(): Promise<void> {
  const servers = takeTestServers();
  if (!servers) return;
  for (const [name, value] of Object.entries(servers.replacedEnv)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
  const results = await Promise.allSettled([
    servers.temporal?.stop(),
    servers.minio?.started && fs.existsSync(servers.minioStateFile)
      ? minioFromState(servers.minioStateFile).stop()
      : servers.minio?.stop(),
  ]);
  if (process.env.STASIS_TEST_KEEP_DATA === '1') {
    process.stderr.write(`stasis: test servers' data and logs kept in ${servers.dataDir}\n`);
  } else {
    // A sandbox volume a failed test left mounted would make the removal fail (EBUSY).
    for (const point of mountsUnder(servers.dataDir).reverse()) execFileSync('umount', ['--lazy', point]);
    fs.rmSync(servers.dataDir, { recursive: true, force: true });
  }
  const failed = results.filter((result): result is PromiseRejectedResult => result.status === 'rejected');
  if (failed.length > 0) throw new Error(`teardown: ${failed.map((result) => String(result.reason)).join('; ')}`);
}
