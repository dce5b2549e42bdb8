import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildApi } from '../../api/server';
import { StasisError } from '../../common/errors';
import type { SandboxProvider } from '../../providers/api';
import { createBwrapProvider } from '../../providers/bwrap';
import { sandboxPaths } from '../../providers/sandbox-state';
import { errorCode, errorMessage, listenOnLoopback, type CallOptions, type HttpResult } from '../api/http';
import { startStack, unprintedWorkerLogs, type TestStack } from '../helpers/stack';
import { makeHost, sh, type Host } from '../providers/harness';
import { context, swapLoop, swapping, tempDir } from '../providers/helpers';
import { Tally, writeSummary } from './helpers';

// Area file-access: a sandbox's own process attacks the worker's file API.
// Inside the sandbox (a long exec, running beside the requests) it swaps a directory
// with a link to a host directory, and another with a link to the worker's
// /proc/self, as fast as it can, while thousands of reads and writes go through
// the provider, for both providers, and hundreds through the REST route. Not one
// may read host content or write outside the workspace. Then FIFOs, sockets and
// devices named like the file asked for: refused at once, many at a time,
// without blocking the worker.

const tally = new Tally();
const figures = { escapes: 0, reads: 0, writes: 0, refused: 0 };
const INSIDE = 'INSIDE-CONTENT';
const HOST_SECRET = 'HOST-SECRET-CONTENT';

const PROVIDERS: Record<string, () => Promise<Host>> = {
  local: () => makeHost(),
  bwrap: () => makeHost({ make: (deps) => createBwrapProvider(deps) }),
};

/**
 * A shell command running the attackers until the sandbox stops. (Run as a long
 * exec the test does not wait for: under bwrap a background process does not
 * outlive its command's pid namespace.)
 */
function attackers(...swaps: [name: string, target: string][]): string {
  const quote = (arg: string) => `'${arg.replaceAll("'", `'\\''`)}'`;
  return `${swaps.map(([name, target]) => `${swapLoop(name, target).map(quote).join(' ')} &`).join(' ')} wait`;
}

/** A host directory the attacker points at: one file with a secret, which must never be read nor joined by another. */
async function hostDir(): Promise<string> {
  const dir = await tempDir('host-dir');
  await fs.writeFile(path.join(dir, 'secret'), HOST_SECRET);
  return dir;
}

async function hostDirUntouched(dir: string): Promise<void> {
  expect(await fs.readdir(dir)).toEqual(['secret']);
  expect(await fs.readFile(path.join(dir, 'secret'), 'utf8')).toBe(HOST_SECRET);
}

/** A refusal the API documents for a file request: 400 or 404, never anything else. */
function expectRefusal(err: unknown): void {
  expect(err).toBeInstanceOf(StasisError);
  expect(['INVALID_ARGUMENT', 'NOT_FOUND']).toContain((err as StasisError).code);
  figures.refused += 1;
}

/** The same over REST: 400 INVALID_ARGUMENT or 404 NOT_FOUND. */
function expectRestRefusal(trial: string, response: HttpResult): void {
  const seen = { trial, status: response.status, code: errorCode(response) };
  expect([
    { trial, status: 400, code: 'INVALID_ARGUMENT' },
    { trial, status: 404, code: 'NOT_FOUND' },
  ]).toContainEqual(seen);
  figures.refused += 1;
}

/** Every regular file in `dir` (links not followed), by name, with its content. */
async function filesIn(dir: string): Promise<Map<string, string>> {
  const found = new Map<string, string>();
  for (const entry of await fs.readdir(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isFile()) {
      found.set(entry.name, await fs.readFile(path.join(entry.parentPath, entry.name), 'utf8'));
    }
  }
  return found;
}

describe.each(Object.keys(PROVIDERS))('%s provider', (providerName) => {
  test('a swap loop inside the sandbox: thousands of reads and writes, no escape', async () => {
    const host = await PROVIDERS[providerName]();
    const provider: SandboxProvider = host.provider;
    const id = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, id).workspace;
    const outside = await hostDir();
    // The real directories hold their own files; `p/environ` stands for the worker's /proc/self/environ.
    await sh(provider, id, `mkdir d p && printf ${INSIDE} > d/secret && printf ${INSIDE} > p/environ`);
    const attack = provider.exec(
      { sandboxId: id, fence: 1, jobId: 'attacker', command: attackers(['d', outside], ['p', '/proc/self']) },
      context(),
    );
    await swapping(path.join(workspace, 'd'));
    await swapping(path.join(workspace, 'p'));

    const written = new Set<string>();
    const counts = { readOk: 0, writeOk: 0 };
    // Stops the attacker however the race ends.
    const race = Promise.all(
      Array.from({ length: 8 }, async (_, lane) => {
        for (let i = 0; i < 500; i++) {
          const trial = `${providerName} lane ${lane} #${i}`;
          tally.start(trial, `${trial}: escaped or unverified`);
          tally.inject();
          if (i % 4 === 3) {
            // Writes, some with a missing directory on the way (created inside the real one, never through the link).
            const name = `w-${lane}-${i}`;
            const file = i % 8 === 3 ? `d/${name}` : `d/new-${name}/${name}`;
            figures.writes += 1;
            try {
              await provider.writeFile({ sandboxId: id, path: file, content: Buffer.from(name) }, context());
              written.add(name);
              counts.writeOk += 1;
            } catch (err) {
              expectRefusal(err);
            }
            continue; // verified below, once the attacker stopped
          }
          const file = i % 2 === 0 ? 'd/secret' : 'p/environ';
          figures.reads += 1;
          const content = await provider.readFile({ sandboxId: id, path: file }, context()).then(
            (bytes) => bytes.toString('utf8'),
            (err: unknown) => void expectRefusal(err),
          );
          if (content !== undefined) {
            counts.readOk += 1;
            if (content !== INSIDE) figures.escapes += 1;
            expect({ trial, content }).toEqual({ trial, content: INSIDE });
          }
          tally.ok(trial);
        }
      }),
    ).then(async () => {
      // The attacker ran all along, and the race was real: some requests got through, some were refused.
      await swapping(path.join(workspace, 'd'));
      await swapping(path.join(workspace, 'p'));
    });
    await race.finally(() => provider.stop({ sandboxId: id, fence: 1 }, context()));
    expect((await attack).exitCode).not.toBe(0); // it ran until stopped
    expect(counts.readOk).toBeGreaterThan(0);
    expect(counts.writeOk).toBeGreaterThan(0);

    // Nothing written outside, the host file unchanged; every write that succeeded is in the workspace.
    await hostDirUntouched(outside);
    const inside = await filesIn(workspace);
    for (const name of written) expect({ name, content: inside.get(name) }).toEqual({ name, content: name });
    for (let lane = 0; lane < 8; lane++)
      for (let i = 3; i < 500; i += 4) tally.ok(`${providerName} lane ${lane} #${i}`);
    await provider.destroy({ sandboxId: id, fence: 1 }, context());
  }, 600_000);

  test('FIFOs, sockets and devices named like the file: refused at once, several at a time, nothing blocked', async () => {
    const host = await PROVIDERS[providerName]();
    const provider = host.provider;
    const id = await host.sandbox();
    const workspace = sandboxPaths(host.dataDir, id).workspace;
    await sh(
      provider,
      id,
      [
        'printf plain > plain.txt; mkdir dir',
        'for i in 0 1 2 3 4 5 6 7; do mkfifo fifo-$i; done; mkfifo dir/fifo',
        `perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Local => "sock", Listen => 1) or die $!'`,
      ].join('; '),
    );
    const specials = [...Array.from({ length: 8 }, (_, i) => `fifo-${i}`), 'dir/fifo', 'sock'];
    // A device node needs CAP_MKNOD, which a sandbox lacks: put there by the host when the tests run as root.
    if (process.getuid?.() === 0) {
      execFileSync('mknod', [path.join(workspace, 'null'), 'c', '1', '3']);
      specials.push('null');
    }
    // Should an open ever block (the bug this guards against), free the threads so the test fails instead of hanging.
    let blocked = false;
    const watchdog = setInterval(() => {
      blocked = true;
      spawn('sh', ['-c', 'for f in fifo-* dir/fifo; do : <>"$f"; done'], { cwd: workspace, stdio: 'ignore' });
    }, 20_000);
    try {
      const attempts = specials.flatMap((file) => [
        provider.readFile({ sandboxId: id, path: file }, context()),
        provider.readFile({ sandboxId: id, path: `/workspace/${file}` }, context()),
        provider.writeFile({ sandboxId: id, path: file, content: Buffer.from('x') }, context()),
      ]);
      const settled = Promise.allSettled(attempts);
      // Far more requests than libuv has threads: had any blocked one, this read could not finish.
      expect((await provider.readFile({ sandboxId: id, path: 'plain.txt' }, context())).toString()).toBe('plain');
      for (const [i, result] of (await settled).entries()) {
        const trial = `${providerName} special ${i}`;
        tally.start(trial, `${trial}: not refused`);
        tally.inject();
        expect(result).toMatchObject({
          status: 'rejected',
          reason: { code: 'INVALID_ARGUMENT', message: expect.stringMatching(/not a regular file/) },
        });
        figures.refused += 1;
        tally.ok(trial);
      }
      for (const file of specials) expect((await fs.lstat(path.join(workspace, file))).isFile()).toBe(false);
      expect({ blocked }).toEqual({ blocked: false });
    } finally {
      clearInterval(watchdog);
    }
    await provider.destroy({ sandboxId: id, fence: 1 }, context());
  }, 300_000);
});

describe('through the REST route', () => {
  const TOKEN = 'file-access-Tok3n-0123456789';
  let stack: TestStack;
  let app: FastifyInstance;
  let call: (method: string, url: string, options?: CallOptions) => Promise<HttpResult>;

  beforeAll(async () => {
    // Hundreds of refusals, each an activity failing as it should: kept in workerLogs, not printed.
    unprintedWorkerLogs.push(/^Activity failed/);
    stack = await startStack();
    app = buildApi({
      client: stack.client,
      tokens: [{ name: 'tester', secret: TOKEN, role: 'operator' }],
      logger: false,
    });
    call = await listenOnLoopback(app);
  });
  afterAll(async () => {
    await app?.close();
    await stack?.stop();
  });

  test('a bwrap sandbox swapping a directory and a host link under REST reads and writes: no escape', async () => {
    const { sandboxId } = await stack.client.sandboxes.create({ provider: 'bwrap' });
    await stack.client.sandboxes.start(sandboxId);
    const workspace = path.join(
      stack.config.STASIS_DATA_DIR,
      'hosts',
      'host-a',
      'sandboxes',
      sandboxId,
      'volume',
      'workspace',
    );
    const outside = await hostDir();
    const files = `/api/v1/sandboxes/${sandboxId}/files`;
    const exec = async (command: string) =>
      expect(await stack.client.sandboxes.exec(sandboxId, { command })).toMatchObject({ exitCode: 0 });
    await exec(`mkdir d && printf ${INSIDE} > d/secret && mkfifo fifo`);
    const attack = stack.client.sandboxes.exec(sandboxId, { command: attackers(['d', outside]) });
    attack.catch(() => undefined); // settled when the sandbox stops, checked there
    await swapping(path.join(workspace, 'd'));

    const written = new Set<string>();
    let readOk = 0;
    // Beside the race, FIFO reads through REST: a 400 naming it, several at once.
    const fifoReads = async () => {
      const responses = await Promise.all(
        Array.from({ length: 6 }, () => call('GET', `${files}?path=fifo`, { token: TOKEN })),
      );
      for (const response of responses) {
        expect({ status: response.status, code: errorCode(response), message: errorMessage(response) }).toEqual({
          status: 400,
          code: 'INVALID_ARGUMENT',
          message: expect.stringMatching(/"fifo".*not a regular file/),
        });
        figures.refused += 1;
      }
    };
    const race = Promise.all([
      fifoReads(),
      ...Array.from({ length: 4 }, async (_, lane) => {
        for (let i = 0; i < 75; i++) {
          const trial = `REST lane ${lane} #${i}`;
          tally.start(trial, `${trial}: escaped or unverified`);
          tally.inject();
          if (i % 3 === 2) {
            const name = `r-${lane}-${i}`;
            figures.writes += 1;
            const response = await call('PUT', `${files}?path=d/${name}`, { token: TOKEN, raw: Buffer.from(name) });
            if (response.status === 204) written.add(name);
            else expectRestRefusal(trial, response);
            continue;
          }
          figures.reads += 1;
          const response = await call('GET', `${files}?path=d/secret`, { token: TOKEN });
          if (response.status === 200) {
            readOk += 1;
            if (response.bytes.toString('utf8') !== INSIDE) figures.escapes += 1;
            expect({ trial, content: response.bytes.toString('utf8') }).toEqual({ trial, content: INSIDE });
          } else expectRestRefusal(trial, response);
          tally.ok(trial);
        }
      }),
    ]);
    await race.finally(() => stack.client.sandboxes.stop(sandboxId));
    expect(readOk).toBeGreaterThan(0);
    await attack.then(
      (outcome) => expect(outcome.exitCode).not.toBe(0),
      (err: unknown) => expect(err).toBeInstanceOf(StasisError),
    );
    await hostDirUntouched(outside);
    const inside = await filesIn(workspace);
    for (const name of written) expect({ name, content: inside.get(name) }).toEqual({ name, content: name });
    for (let lane = 0; lane < 4; lane++) for (let i = 2; i < 75; i += 3) tally.ok(`REST lane ${lane} #${i}`);
    await stack.client.sandboxes.destroy(sandboxId);
  }, 600_000);
});

test('summary: no escape, nothing lost', () => {
  writeSummary('file-access', tally, figures);
  expect(tally.lostItems).toEqual([]);
  expect(figures.escapes).toBe(0);
  expect(figures.reads + figures.writes).toBeGreaterThan(8000);
});
