import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';

// Stasis as a separate project uses it: `npm pack` this repository, install the tarball
// into a fresh TypeScript project (offline, from npm's cache), compile that project
// under `strict` against the published types, and run its worker, with its own agent
// driver and its own sandbox provider, against the test Temporal server: one Run
// started through the published client completes through that driver and provider.

const run = promisify(execFile);
const ROOT = path.join(__dirname, '..', '..');
const PROJECT = path.join(__dirname, 'project');
const TSC = path.join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');

interface PackResult {
  filename: string;
  files: { path: string }[];
}

let dir: string;
let pack: PackResult;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'stasis-consumer-'));
  // prepack builds dist/ from a clean slate, so the tarball holds exactly today's sources.
  const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', dir], {
    cwd: ROOT,
    maxBuffer: 64 * 1024 * 1024,
  });
  // The prepack script's own output comes first; npm's JSON report is the last thing printed.
  pack = (JSON.parse(stdout.slice(stdout.lastIndexOf('\n[') + 1)) as PackResult[])[0];
}, 600_000);

test('the tarball holds the built package, its types, the page and docs, and no test or bench code', () => {
  const files = pack.files.map((f) => f.path);
  for (const entry of ['dist/lib/index.js', 'dist/lib/worker.js', 'dist/lib/drivers.js', 'dist/lib/providers.js']) {
    expect(files).toContain(entry);
    expect(files).toContain(entry.replace(/\.js$/, '.d.ts'));
  }
  expect(files).toEqual(
    expect.arrayContaining(['dist/cli/main.js', 'dist/workflows/index.js', 'web/index.html', 'web/app.js']),
  );
  const stray = files.filter(
    (f) =>
      !/^(dist\/|web\/[^/]+\.(html|js|css)$|docs\/|README\.md$|LICENSE$|package\.json$)/.test(f) ||
      /^dist\/(test|bench|scripts)\//.test(f) ||
      /\.test\./.test(f),
  );
  expect(stray).toEqual([]);
});

test("the README's `npx stasis` runs the CLI this repository built (its bin is executable)", async () => {
  const { stdout } = await run('npx', ['--no-install', 'stasis', '--help'], { cwd: ROOT });
  expect(stdout).toContain('Usage: stasis');
});

test('a separate strict TypeScript project installs the tarball, compiles against its types and completes a Run with its own driver and provider', async () => {
  const project = path.join(dir, 'consumer');
  cpSync(PROJECT, project, { recursive: true });
  writeConsumerLock(project, pack.filename);
  // No network: every dependency comes from npm's cache, pinned by this repository's lockfile.
  await run('npm', ['ci', '--offline', '--ignore-scripts', '--no-audit', '--no-fund'], { cwd: project });
  expect(readdirSync(path.join(project, 'node_modules', 'stasis'))).not.toContain('test');
  // Every relative import of a published declaration file names a file that is in the package.
  expect(unresolvedDeclarationImports(path.join(project, 'node_modules', 'stasis', 'dist'))).toEqual([]);

  const compiled = await run(process.execPath, [TSC, '-p', project]).catch((err: { stdout: string }) => err);
  expect(compiled.stdout).toBe('');

  const input = `hello from ${randomUUID().slice(0, 8)}`;
  const { stdout } = await run(process.execPath, [path.join(project, 'dist', 'main.js'), input], {
    cwd: project,
    env: {
      ...process.env,
      STASIS_TASK_QUEUE: `consumer-${randomUUID().slice(0, 8)}`,
      STASIS_DATA_DIR: path.join(dir, 'data'),
      STASIS_HOST_ID: 'consumer-host',
    },
    timeout: 300_000,
  });
  const snapshot = JSON.parse(stdout.trim().split('\n').pop() ?? '') as Record<string, unknown>;
  expect(snapshot).toMatchObject({
    status: 'COMPLETED',
    output: { said: `${input} (run by consumer-dirs)` },
  });
}, 600_000);

/**
 * The consumer's package.json and lockfile: the tarball, plus every dependency at the
 * version (and integrity) this repository's lockfile pins, so `npm ci --offline` finds
 * them all in npm's cache. @types/node lets the consumer's own code use Node's API.
 */
function writeConsumerLock(project: string, tarball: string): void {
  const lock = JSON.parse(readFileSync(path.join(ROOT, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, Record<string, unknown> & { dev?: boolean }>;
  };
  const own = lock.packages[''] as {
    version: string;
    dependencies: Record<string, string>;
    devDependencies: Record<string, string>;
  };
  const resolved = `file:${path.relative(project, path.join(dir, tarball))}`;
  const dependencies = { stasis: resolved, '@types/node': own.devDependencies['@types/node'] };
  const packages: Record<string, unknown> = {
    '': { name: 'stasis-consumer', version: '1.0.0', dependencies },
    'node_modules/stasis': { version: own.version, resolved, dependencies: own.dependencies },
  };
  const typesNode = new Set(['node_modules/@types/node', 'node_modules/undici-types']);
  for (const [key, entry] of Object.entries(lock.packages)) {
    if (key === '' || (entry.dev && !typesNode.has(key))) continue;
    const { dev: _dev, devOptional: _devOptional, ...rest } = entry;
    packages[key] = rest;
  }
  const manifest = JSON.parse(readFileSync(path.join(project, 'package.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ ...manifest, dependencies }, null, 2));
  writeFileSync(
    path.join(project, 'package-lock.json'),
    JSON.stringify(
      { name: 'stasis-consumer', version: '1.0.0', lockfileVersion: 3, requires: true, packages },
      null,
      2,
    ),
  );
}

function unresolvedDeclarationImports(distDir: string): string[] {
  const missing: string[] = [];
  for (const file of readdirSync(distDir, { recursive: true, encoding: 'utf8' })) {
    if (!file.endsWith('.d.ts')) continue;
    const source = readFileSync(path.join(distDir, file), 'utf8');
    for (const [, specifier] of source.matchAll(/(?:from |import\()['"](\.{1,2}\/[^'"]+)['"]/g)) {
      const target = path.resolve(distDir, path.dirname(file), specifier);
      if (!['.d.ts', '/index.d.ts'].some((ext) => existsSync(target + ext))) missing.push(`${file}: ${specifier}`);
    }
  }
  return missing;
}
