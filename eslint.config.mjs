import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

// Workflow code runs in Temporal's deterministic sandbox: no Node built-ins and no
// activity implementations (only their types, for proxyActivities), as in Temporal's samples.
const NODE_BUILTINS = ['fs', 'path', 'child_process', 'crypto', 'os', 'net', 'http', 'https', 'stream', 'zlib'];
const sandboxMessage = 'workflow code runs in the Temporal sandbox: do this in an activity';

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
  {
    files: ['workflows/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          paths: NODE_BUILTINS.map((name) => ({ name, message: sandboxMessage })),
          patterns: [
            // Every `node:` module, the ten above included.
            { group: ['node:*'], message: sandboxMessage },
            {
              group: ['**/activities', '**/activities/*', '**/activities/**'],
              allowTypeImports: true,
              message:
                'workflows may import only types from activities (`import type`), and call them through proxyActivities',
            },
            {
              group: ['@temporalio/activity', '@temporalio/client', '@temporalio/worker'],
              allowTypeImports: true,
              message: 'workflow code may use only @temporalio/workflow and @temporalio/common at run time',
            },
          ],
        },
      ],
    },
  },
);
