import { mkdtempSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import fc from 'fast-check';
import { loadConfig } from '../../common/config';
import { configProblems } from '../helpers/config';

// The object store's configuration: AWS S3 chosen by AWS_REGION is in that region, and an S3 key
// pair is given whole (half of one was dropped, and the AWS SDK took whatever else it found).

// No temporal.toml of the machine's may leak in.
const HOME = mkdtempSync(path.join(os.tmpdir(), 'config-s3-'));

test('AWS S3 chosen by AWS_REGION is in that region; STASIS_S3_REGION wins; an endpoint keeps its own default', () => {
  const aws = { HOME, STASIS_SNAPSHOT_STORE: 's3', AWS_REGION: 'eu-west-1' };
  expect(loadConfig(aws).STASIS_S3_REGION).toBe('eu-west-1');
  expect(loadConfig({ ...aws, STASIS_S3_REGION: 'us-west-2' }).STASIS_S3_REGION).toBe('us-west-2');
  expect(loadConfig({ ...aws, STASIS_S3_ENDPOINT: 'http://127.0.0.1:9000' }).STASIS_S3_REGION).toBe('us-east-1');
  expect(loadConfig({ HOME, STASIS_S3_ENDPOINT: 'http://127.0.0.1:9000' }).STASIS_S3_REGION).toBe('us-east-1');
});

test('half an S3 key pair is a configuration error naming the missing half, never printing the other', () => {
  fc.assert(
    fc.property(
      fc.constantFrom('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY'),
      fc.stringMatching(/^[A-Za-z0-9/+]{8,40}$/),
      (given, value) => {
        const missing = given === 'AWS_ACCESS_KEY_ID' ? 'AWS_SECRET_ACCESS_KEY' : 'AWS_ACCESS_KEY_ID';
        const problems = configProblems({ HOME, STASIS_S3_ENDPOINT: 'http://127.0.0.1:9000', [given]: value });
        expect(problems).toEqual([expect.stringMatching(new RegExp(`^${missing}: must be set with ${given}`))]);
        expect(problems.join('\n')).not.toContain(value);
      },
    ),
  );
  expect(
    configProblems({
      HOME,
      STASIS_S3_ENDPOINT: 'http://127.0.0.1:9000',
      AWS_ACCESS_KEY_ID: 'a',
      AWS_SECRET_ACCESS_KEY: 'b',
    }),
  ).toEqual([]);
});
