// Fault tests (servers stopped and restarted under running Runs) run on their
// own, after the main suite, so they never disturb the tests that share the servers.
const base = require('./jest.config.js');

/** @type {import('jest').Config} */
module.exports = {
  ...base,
  testMatch: ['<rootDir>/test/faults/**/*.test.ts'],
  testPathIgnorePatterns: ['/node_modules/', '/dist/'],
  // One at a time: a fault test stops servers that every other test would share.
  maxWorkers: 1,
};
