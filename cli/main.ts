#!/usr/bin/env node
import { runCli } from './program';

// The `stasis` executable (package.json "bin").
// The AWS SDK warns that its Node 20 support ends in 2027; package.json already says Node >= 20.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
void runCli(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, env: process.env }).then(
  (code) => {
    process.exitCode = code;
  },
);
