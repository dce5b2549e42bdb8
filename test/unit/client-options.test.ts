import { mkdtempSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { clientOptions } from '../../client/options';
import { loadConfig } from '../../common/config';
import { FsFiguresStore } from '../../stores/figures';

// A library user's client made from the configuration gets what the CLI's gets, the workers'
// figures included: without them metricsSnapshot reported 0 failures, retries and releases
// (no way to reach the figures store was exported).

test('clientOptions reads the figures the workers wrote to the configured store', async () => {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'client-options-'));
  const config = loadConfig({ HOME: dataDir, STASIS_DATA_DIR: dataDir, STASIS_TASK_QUEUE: 'q1' });
  const figures = {
    hostId: 'host-a',
    failures: 2,
    retries: 3,
    releases: 4,
    releaseLatencyMs: [10, 20],
    updatedAt: new Date(0).toISOString(),
  };
  await new FsFiguresStore(path.join(dataDir, 'metrics')).write(figures);
  const options = clientOptions(config);
  expect(options).toMatchObject({ taskQueue: 'q1', namespace: config.TEMPORAL_NAMESPACE });
  expect(await options.workerMetrics?.()).toEqual([figures]);
});
