#!/usr/bin/env node
// Builds the Temporal CLI and MinIO into the machine's cache if they are missing
// (see platform/binaries.ts), before anything else in CI needs them; with
// --cluster, the Temporal server and temporal-sql-tool of the cluster test. Plain JS so
// it runs right after `npm ci`, without a build: the TypeScript source is
// transpiled in memory with the project's own compiler.
'use strict';

const fs = require('node:fs');
const Module = require('node:module');
const path = require('node:path');
const ts = require('typescript');

function loadTs(file) {
  const source = fs.readFileSync(file, 'utf8');
  const { outputText } = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
    fileName: file,
  });
  const mod = new Module(file, module);
  mod.filename = file;
  mod.paths = Module._nodeModulePaths(path.dirname(file));
  mod._compile(outputText, file);
  return mod.exports;
}

const { binDir, ensureBinaries, ensureClusterBinaries } = loadTs(path.join(__dirname, '..', 'platform', 'binaries.ts'));

const cluster = process.argv.includes('--cluster');
(cluster ? ensureClusterBinaries() : ensureBinaries()).then(
  (paths) => {
    console.log(`stasis: binaries ready in ${binDir()}: ${Object.keys(paths).join(', ')}`);
  },
  (error) => {
    console.error(error instanceof Error ? error.message : error);
    process.exit(1);
  },
);
