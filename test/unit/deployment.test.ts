import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { TEMPORAL_SERVER_VERSION } from '../../platform/binaries';
import { SEARCH_ATTRIBUTE_TYPES } from '../../workflows/search-attributes';

// docker-compose.temporal.yml is the deployment `npm run test:cluster` runs without
// Docker: the same server release, dynamic config and search attributes.

const ROOT = path.resolve(__dirname, '..', '..');
const compose = readFileSync(path.join(ROOT, 'docker-compose.temporal.yml'), 'utf8');
const release = TEMPORAL_SERVER_VERSION.replace(/^v/, '');

test('the compose file runs the Temporal server release the cluster test builds', () => {
  expect(compose).toContain(`image: temporalio/server:\${TEMPORAL_VERSION:-${release}}`);
  for (const [, tag] of compose.matchAll(/temporalio\/admin-tools:\$\{TEMPORAL_ADMINTOOLS_VERSION:-([^}]+)\}/g)) {
    expect(tag.startsWith(`${release}-`)).toBe(true);
  }
});

test("the compose file mounts the cluster test's dynamic config and registers every Stasis search attribute", () => {
  expect(compose).toContain('./deploy/temporal/dynamicconfig.yaml:/etc/temporal/config/dynamicconfig/stasis.yaml');
  expect(compose).toContain('DYNAMIC_CONFIG_FILE_PATH: config/dynamicconfig/stasis.yaml');
  for (const [name, type] of Object.entries(SEARCH_ATTRIBUTE_TYPES)) {
    expect(compose).toMatch(new RegExp(`--name ${name} --type ${type}\\b`));
  }
  const dynamic = readFileSync(path.join(ROOT, 'deploy', 'temporal', 'dynamicconfig.yaml'), 'utf8');
  expect(dynamic).toMatch(/^system\.forceSearchAttributesCacheRefreshOnRead:\n {2}- value: true$/m);
});
