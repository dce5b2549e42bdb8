// Integration tests share one Temporal dev server and one MinIO, started by the
// global setup; TypeScript goes through swc (no type check here: `npm run lint` does that).
/** @type {import('jest').Config} */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testMatch: ['<rootDir>/test/**/*.test.ts'],
  testPathIgnorePatterns: ['/node_modules/', '/dist/', '<rootDir>/test/faults/', '<rootDir>/test/cluster/'],
  transform: {
    '^.+\\.(t|j)s$': [
      '@swc/jest',
      {
        jsc: { parser: { syntax: 'typescript' }, target: 'es2022' },
        module: { type: 'commonjs' },
        sourceMaps: 'inline',
      },
    ],
  },
  globalSetup: './test/global-setup.ts',
  globalTeardown: './test/global-teardown.ts',
  testTimeout: 120_000,
  maxWorkers: 2,
};
