import { mkdtempSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { runStasis } from './spawn';

// A namespace the Temporal server does not have is a configuration error naming TEMPORAL_NAMESPACE
// (exit 2), for a one-shot command, the API server and a worker alike: `stasis worker` printed a raw
// NotFound and then never exited, and `stasis api` started serving calls that could only fail.

const env = (): NodeJS.ProcessEnv => ({
  ...process.env,
  TEMPORAL_NAMESPACE: 'no-such-namespace',
  STASIS_DATA_DIR: mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'cli-ns-')),
  STASIS_HTTP_ADDR: '127.0.0.1:0',
  STASIS_API_TOKENS: 'ops:namespace-test-secret',
});

test.each([[['run', 'list']], [['worker']], [['api']]])(
  'stasis %j with a namespace the server does not have exits 2 naming TEMPORAL_NAMESPACE',
  async (args) => {
    const result = await runStasis(args, env(), 60_000);
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 2,
      stderr: expect.stringContaining('TEMPORAL_NAMESPACE: "no-such-namespace" does not exist on'),
    });
    expect(result.stdout).not.toContain('stasis api:');
  },
  90_000,
);
