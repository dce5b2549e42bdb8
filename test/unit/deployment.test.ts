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
  // Exactly the workflows' attributes: none missing, none left over from a rename.
  const registered = [...compose.matchAll(/--name (\w+) --type (\w+)/g)].map(([, name, type]) => [name, type]);
  expect(Object.fromEntries(registered)).toEqual(SEARCH_ATTRIBUTE_TYPES);
  expect(registered).toHaveLength(Object.keys(SEARCH_ATTRIBUTE_TYPES).length);
  const dynamic = readFileSync(path.join(ROOT, 'deploy', 'temporal', 'dynamicconfig.yaml'), 'utf8');
  expect(dynamic).toMatch(/^system\.forceSearchAttributesCacheRefreshOnRead:\n {2}- value: true$/m);
});

test("README's Temporal Cloud command adds exactly the workflows' search attributes", () => {
  const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const added = [...readme.matchAll(/--sa\s+(\w+)=(\w+)/g)].map(([, name, type]) => [name, type]);
  expect(Object.fromEntries(added)).toEqual(SEARCH_ATTRIBUTE_TYPES);
  expect(added).toHaveLength(Object.keys(SEARCH_ATTRIBUTE_TYPES).length);
});
