// The cluster test (test/cluster): its own PostgreSQL, Temporal server, MinIO and
// Stasis processes, so no shared dev server; one file, run on its own after the
// fault tests. The first run builds the Temporal server and its schema tool.
const base = require('./jest.config.js');

/** @type {import('jest').Config} */
module.exports = {
  ...base,
  testMatch: ['<rootDir>/test/cluster/**/*.test.ts'],
  testPathIgnorePatterns: ['/node_modules/', '/dist/'],
  globalSetup: undefined,
  globalTeardown: undefined,
  maxWorkers: 1,
  testTimeout: 600_000,
};
