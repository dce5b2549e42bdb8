import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

// Workflow code runs in Temporal's deterministic sandbox: no Node built-ins and no
// activity implementations (only their types, for proxyActivities), as in Temporal's samples.
const NODE_BUILTINS = ['fs', 'path', 'child_process', 'crypto', 'os', 'net', 'http', 'https', 'stream', 'zlib'];
const sandboxMessage = 'workflow code runs in the Temporal sandbox: do this in an activity';
const WORKFLOW_PATTERNS = [
  // Every `node:` module, the ten above included.
  { group: ['node:*'], message: sandboxMessage },
  {
    group: ['@temporalio/activity', '@temporalio/client', '@temporalio/worker'],
    allowTypeImports: true,
    message: 'workflow code may use only @temporalio/workflow and @temporalio/common at run time',
  },
];

export default defineConfig(
  { ignores: ['dist/', 'node_modules/', 'coverage/', '.stasis/'] },
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // Plain CommonJS files: configs and scripts run by Node directly.
    files: ['**/*.js', '**/*.cjs'],
    languageOptions: {
      sourceType: 'commonjs',
      globals: {
        require: 'readonly',
        module: 'writable',
        exports: 'writable',
        process: 'readonly',
        console: 'readonly',
        __dirname: 'readonly',
        __filename: 'readonly',
      },
    },
    rules: { '@typescript-eslint/no-require-imports': 'off' },
  },
  ...layerRules(),
);

// Imports go downward only (README, Design): surfaces (api, cli, mcp, web) → client →
// workflows/activities → providers/stores/drivers → common. Each entry names what a directory may
// not import at run time; `types` lists what it may still import as types only.
function layerRules() {
  const SURFACES = ['api', 'cli', 'mcp', 'web'];
  const ROOTS = ['workers', 'platform', 'bench', 'test'];
  const layers = {
    common: { never: ['stores', 'providers', 'drivers', 'activities', 'workflows', 'client', ...SURFACES, ...ROOTS] },
    stores: { never: ['providers', 'drivers', 'activities', 'workflows', 'client', ...SURFACES, ...ROOTS] },
    providers: { never: ['drivers', 'activities', 'workflows', 'client', ...SURFACES, ...ROOTS] },
    drivers: { never: ['stores', 'providers', 'activities', 'workflows', 'client', ...SURFACES, ...ROOTS] },
    activities: { never: ['client', ...SURFACES, ...ROOTS] },
    workflows: {
      never: ['client', ...SURFACES, ...ROOTS],
      types: ['activities', 'providers', 'stores', 'drivers'],
    },
    client: { never: [...SURFACES, ...ROOTS], types: ['activities', 'providers', 'stores', 'drivers'] },
    // The MCP server is a client of the REST API, so it may use the API's contract (routes, schemas).
    api: { never: ['cli', 'mcp', ...ROOTS], types: ['workflows', 'activities', 'providers', 'stores', 'drivers'] },
    mcp: { never: ['cli', 'web', ...ROOTS], types: ['workflows', 'activities', 'providers', 'stores', 'drivers'] },
    web: {
      never: ['client', 'workflows', 'activities', 'providers', 'stores', 'drivers', 'api', 'cli', 'mcp', ...ROOTS],
    },
    workers: { never: ['client', ...SURFACES, 'bench', 'test'] },
    platform: {
      never: ['client', 'activities', 'providers', 'stores', 'drivers', ...SURFACES, 'workers', 'bench', 'test'],
    },
    cli: { never: ['bench', 'test'] },
    bench: { never: ['test'] },
  };
  const dirs = (names) => `^(\\.\\./)+(${names.join('|')})(/|$)`;
  return Object.entries(layers).map(([dir, { never, types = [] }]) => {
    const patterns = [
      { regex: dirs(never), message: `${dir}/ may not import this layer (imports go downward only: README, Design)` },
    ];
    if (types.length > 0) {
      patterns.push({
        regex: dirs(types),
        allowTypeImports: true,
        message: `${dir}/ may import only types from this layer (imports go downward only: README, Design)`,
      });
    }
    if (dir === 'workflows') patterns.push(...WORKFLOW_PATTERNS);
    return {
      files: [`${dir}/**/*.ts`],
      rules: {
        '@typescript-eslint/no-restricted-imports': [
          'error',
          {
            paths: dir === 'workflows' ? NODE_BUILTINS.map((name) => ({ name, message: sandboxMessage })) : [],
            patterns,
          },
        ],
      },
    };
  });
}
