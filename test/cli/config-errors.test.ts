import { mkdtempSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { pemFiles } from '../helpers/config';
import { runStasis } from './spawn';

// Configuration a process cannot work with stops it at start with exit 2 and one line naming the
// variable, before it connects to anything. Each of these was exit 1 (INTERNAL) or a failure on the
// first call: a workflow bundle that is missing or not JSON, a client key that is not the certificate's.

const dir = mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'cli-config-'));
const { file, crt, strayKey } = pemFiles(dir);
const env = (vars: Record<string, string>): NodeJS.ProcessEnv => ({
  ...process.env,
  STASIS_DATA_DIR: mkdtempSync(path.join(dir, 'data-')),
  ...vars,
});

test.each([
  [
    'missing',
    path.join(dir, 'no-such-bundle.json'),
    /^ {2}STASIS_WORKFLOW_BUNDLE: cannot read .*no-such-bundle\.json \(ENOENT\)$/m,
  ],
  [
    'not JSON',
    file('bundle.txt', 'not json at all'),
    /^ {2}STASIS_WORKFLOW_BUNDLE: .*bundle\.txt is not a workflow bundle/m,
  ],
  [
    'JSON without code',
    file('bundle.json', '{"sourceMap":"x"}'),
    /^ {2}STASIS_WORKFLOW_BUNDLE: .*bundle\.json is not a workflow bundle/m,
  ],
])(
  'stasis worker with a workflow bundle %s exits 2 naming STASIS_WORKFLOW_BUNDLE',
  async (_, bundle, line) => {
    const result = await runStasis(['worker'], env({ STASIS_WORKFLOW_BUNDLE: bundle }), 60_000);
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 2,
      stderr: expect.stringMatching(/^stasis: configuration error\n/),
    });
    expect(result.stderr).toMatch(line);
  },
  90_000,
);

test.each([[['run', 'list']], [['worker']]])(
  "stasis %j with a client key that is not the certificate's exits 2 naming the key",
  async (args) => {
    const result = await runStasis(
      args,
      env({ TEMPORAL_TLS_CLIENT_CERT_PATH: crt, TEMPORAL_TLS_CLIENT_KEY_PATH: strayKey }),
      60_000,
    );
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 2,
      stderr: `stasis: configuration error\n  TEMPORAL_TLS_CLIENT_KEY_PATH: not the key of the certificate in TEMPORAL_TLS_CLIENT_CERT_PATH\n`,
    });
  },
  90_000,
);
