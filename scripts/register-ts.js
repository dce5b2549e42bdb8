// Lets `node -r ./scripts/register-ts.js cli/main.ts` run the TypeScript
// sources directly (tests spawn the real CLI without a build step), compiling
// each file with swc as jest does.
'use strict';

const fs = require('node:fs');
const { transformSync } = require('@swc/core');

require.extensions['.ts'] = function compile(module, filename) {
  const { code } = transformSync(fs.readFileSync(filename, 'utf8'), {
    filename,
    jsc: { parser: { syntax: 'typescript' }, target: 'es2022' },
    module: { type: 'commonjs' },
    sourceMaps: 'inline',
  });
  module._compile(code, filename);
};
