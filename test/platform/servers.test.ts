import { HeadBucketCommand, S3Client } from '@aws-sdk/client-s3';
import { Connection } from '@temporalio/client';
import { encodeSearchAttributeIndexedValueType } from '@temporalio/common/lib/search-attributes';
import { loadConfig } from '../../common/config';
import { configProblems as problems } from '../helpers/config';
import { spawnGroup, stopGroup, isAlive } from '../../platform/servers';
import { searchAttributeType } from '../../platform/temporal-server';
import { SEARCH_ATTRIBUTE_TYPES } from '../../workflows/search-attributes';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

// The servers the global setup started, as every other test will use them.

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set; run through jest's global setup`);
  return value;
}

describe('Temporal dev server', () => {
  let connection: Connection;
  beforeAll(async () => {
    connection = await Connection.connect({ address: env('TEMPORAL_ADDRESS') });
  });
  afterAll(async () => {
    await connection.close();
  });

  it('serves the namespace', async () => {
    const response = await connection.workflowService.describeNamespace({ namespace: env('TEMPORAL_NAMESPACE') });
    expect(response.namespaceInfo?.name).toBe(env('TEMPORAL_NAMESPACE'));
  });

  it('has the 9 Stasis search attributes with their types', async () => {
    const { customAttributes } = await connection.operatorService.listSearchAttributes({
      namespace: env('TEMPORAL_NAMESPACE'),
    });
    const expected = Object.fromEntries(
      Object.keys(SEARCH_ATTRIBUTE_TYPES).map((name) => [name, searchAttributeType(name)]),
    );
    expect(Object.keys(expected)).toHaveLength(9);
    expect(expected.StasisLabels).toBe(encodeSearchAttributeIndexedValueType('KEYWORD_LIST'));
    const registered = Object.fromEntries(Object.keys(expected).map((name) => [name, customAttributes?.[name]]));
    expect(registered).toEqual(expected);
  });
});

describe('MinIO', () => {
  it('has the checkpoints bucket', async () => {
    const client = new S3Client({
      endpoint: env('STASIS_S3_ENDPOINT'),
      region: env('STASIS_S3_REGION'),
      forcePathStyle: true,
      credentials: { accessKeyId: env('AWS_ACCESS_KEY_ID'), secretAccessKey: env('AWS_SECRET_ACCESS_KEY') },
    });
    try {
      const response = await client.send(new HeadBucketCommand({ Bucket: env('STASIS_S3_BUCKET') }));
      expect(response.$metadata.httpStatusCode).toBe(200);
    } finally {
      client.destroy();
    }
  });
});

describe('process groups', () => {
  it('stop() ends the whole group, forked children included', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'stasis-group-'));
    const pidFile = path.join(dir, 'child.pid');
    // The shell ignores SIGTERM, so this also exercises the SIGKILL fallback.
    const group = spawnGroup('sh', ['-c', `trap '' TERM; sleep 60 & echo $! > ${pidFile}; wait`], {
      logFile: path.join(dir, 'group.log'),
    });
    while (!fs.existsSync(pidFile) || fs.readFileSync(pidFile, 'utf8').trim() === '') {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const grandchild = Number(fs.readFileSync(pidFile, 'utf8'));
    await stopGroup(group.pid, 300);
    expect(isAlive(group.pid)).toBe(false);
    expect(isAlive(grandchild)).toBe(false);
    fs.rmSync(dir, { recursive: true, force: true });
  });
});

describe('configuration', () => {
  it('accepts an empty environment with the defaults of the spec', () => {
    const config = loadConfig({});
    expect(config.TEMPORAL_NAMESPACE).toBe('default');
    expect(config.STASIS_SUSPENDED_RETENTION_SECONDS).toBe(2_592_000);
    expect(config.STASIS_ORPHAN_DORMANT_DIR_TTL_SECONDS).toBe(86_400);
    expect(config.snapshotStore).toBe('fs');
  });

  it.each([
    ['STASIS_SUSPENDED_RETENTION_SECONDS', 'abc'],
    ['STASIS_ORPHAN_DORMANT_DIR_TTL_SECONDS', '-1'],
    ['STASIS_SNAPSHOT_STORE', 'x'],
    ['TEMPORAL_ADDRESS', 'not an address'],
    ['STASIS_S3_ENDPOINT', 'nope'],
    ['STASIS_HTTP_ADDR', '8080'],
    ['STASIS_API_TOKENS', 'no-secret'],
    ['STASIS_TASK_QUEUE', 'has space'],
  ])('rejects %s=%s with one line naming it', (name, value) => {
    const lines = problems({ [name]: value });
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^${name}: `));
    expect(lines[0]).not.toContain('\n');
  });

  it('reports every bad variable, one line each', () => {
    const lines = problems({ STASIS_SUSPENDED_RETENTION_SECONDS: 'abc', STASIS_SNAPSHOT_STORE: 'x' });
    expect(lines.map((line) => line.split(':')[0]).sort()).toEqual([
      'STASIS_SNAPSHOT_STORE',
      'STASIS_SUSPENDED_RETENTION_SECONDS',
    ]);
  });

  it('requires an endpoint for the s3 store', () => {
    expect(problems({ STASIS_SNAPSHOT_STORE: 's3' })).toEqual([expect.stringMatching(/^STASIS_S3_ENDPOINT: /)]);
  });
});
