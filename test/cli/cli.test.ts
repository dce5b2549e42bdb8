import { isUtf8 } from 'node:buffer';
import { execFileSync, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import fc from 'fast-check';
import { readSpec } from '../../cli/commands/runs';
import type { InteractionRequest, MetricsSnapshot, RunSnapshot, SandboxView } from '../../common/schemas';
import { freePorts } from '../../platform/servers';
import { eventually } from '../helpers/stack';
import { CLI, runStasis, spawnStasis } from './spawn';

// The `stasis` executable as a user runs it: `stasis dev` in the background
// (against the jest global setup's Temporal and MinIO), and every other command
// as its own process against it.

interface DevSummary {
  temporal: { address: string; namespace: string; webUrl: string | null };
  store: string;
  worker: { hostId: string; taskQueue: string; metricsUrl: string | null };
  apiUrl: string;
  pageUrl: string;
  signInUrl: string | null;
}

const EXAMPLES = path.join(CLI.cwd, 'examples');
let env: NodeJS.ProcessEnv;
let dev: ChildProcess;
let devExit: Promise<number | null>;
let devOut = '';
let devErr = '';
let summary: DevSummary;

beforeAll(async () => {
  const [httpPort, metricsPort, hostMetricsPort] = await freePorts(3);
  const { STASIS_API_TOKENS: _none, ...inherited } = process.env;
  env = {
    ...inherited,
    STASIS_TASK_QUEUE: `cli-${randomUUID().slice(0, 8)}`,
    STASIS_DATA_DIR: mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'cli-')),
    STASIS_HOST_ID: 'cli-host',
    STASIS_HTTP_ADDR: `127.0.0.1:${httpPort}`,
    STASIS_WORKER_METRICS_ADDR: `127.0.0.1:${metricsPort}`,
    STASIS_METRICS_ADDR: `127.0.0.1:${hostMetricsPort}`,
  };
  dev = spawnStasis(['dev', '--json'], env);
  devExit = new Promise((resolve) => dev.once('exit', (code) => resolve(code)));
  dev.stdout?.on('data', (chunk: Buffer) => (devOut += chunk.toString('utf8')));
  dev.stderr?.on('data', (chunk: Buffer) => (devErr += chunk.toString('utf8')));
  summary = await eventually(
    async () => {
      if (dev.exitCode !== null) throw new Error(`stasis dev exited ${dev.exitCode}: ${devErr}`);
      try {
        return JSON.parse(devOut) as DevSummary;
      } catch {
        return undefined;
      }
    },
    150_000,
    'stasis dev to be ready',
  );
}, 180_000);

afterAll(async () => {
  if (dev && dev.exitCode === null) {
    dev.kill('SIGKILL');
    await devExit;
  }
});

const stasis = (...args: string[]) => runStasis(args, env);
async function json<T>(...args: string[]): Promise<T> {
  const result = await stasis(...args, '--json');
  if (result.code !== 0)
    throw new Error(`stasis ${args.join(' ')} exited ${result.code}: ${result.stdout}${result.stderr}`);
  return JSON.parse(result.stdout) as T;
}
/** What `stasis run list --waiting` prints, once it lists the Run. */
const waitingList = (runId: string) =>
  eventually(
    async () => {
      const list = await stasis('run', 'list', '--waiting');
      return list.stdout.includes(runId) && list.stdout;
    },
    60_000,
    'the Run in the waiting list',
  );
/** The Run as `stasis run get --json` shows it, once COMPLETED. */
const completed = (runId: string) =>
  eventually(
    async () => {
      const run = await json<RunSnapshot>('run', 'get', runId);
      return run.status === 'COMPLETED' && run;
    },
    60_000,
    'COMPLETED',
  );
const signInToken = () => new URL(summary.signInUrl ?? '').searchParams.get('token') ?? '';

test('stasis dev prints its URLs and a sign-in link with a generated token that the API accepts', async () => {
  expect(summary).toMatchObject({
    temporal: { address: process.env.TEMPORAL_ADDRESS, webUrl: null },
    store: `S3 at ${process.env.STASIS_S3_ENDPOINT} (bucket ${process.env.STASIS_S3_BUCKET})`,
    worker: {
      hostId: 'cli-host',
      taskQueue: env.STASIS_TASK_QUEUE,
      metricsUrl: `http://${env.STASIS_WORKER_METRICS_ADDR}/metrics`,
      hostMetricsUrl: `http://${env.STASIS_METRICS_ADDR}/metrics`,
    },
    apiUrl: `http://${env.STASIS_HTTP_ADDR}/api/v1`,
    pageUrl: `http://${env.STASIS_HTTP_ADDR}/`,
  });
  expect(summary.signInUrl).toMatch(new RegExp(`^http://${env.STASIS_HTTP_ADDR}/\\?token=[A-Za-z0-9_-]{32}$`));
  // The Temporal the environment names is waited for, not started.
  expect(devErr).toContain(`waiting for Temporal at ${process.env.TEMPORAL_ADDRESS}`);
  expect(devErr).not.toContain('starting the Temporal dev server');
  const authorized = await fetch(`${summary.apiUrl}/runs?status=WAITING`, {
    headers: { authorization: `Bearer ${signInToken()}` },
  });
  expect(authorized.status).toBe(200);
  expect((await fetch(`${summary.apiUrl}/runs`)).status).toBe(401);
  expect((await fetch(summary.pageUrl)).headers.get('content-type')).toContain('text/html');
});

test("the worker started by stasis dev serves the Temporal SDK's own metrics", async () => {
  const text = await eventually(
    async () => {
      const body = await (await fetch(summary.worker.metricsUrl ?? '')).text();
      return /^temporal_\w+/m.test(body) && body;
    },
    30_000,
    'SDK metrics',
  );
  expect(text).toMatch(/temporal_worker_start|temporal_.*task_queue="/);
});

test("the worker started by stasis dev serves its host's own Stasis metrics", async () => {
  const response = await fetch(`http://${env.STASIS_METRICS_ADDR}/metrics`);
  expect(response.headers.get('content-type')).toContain('text/plain');
  const text = await response.text();
  expect(text).toMatch(/^# TYPE stasis_release_duration_seconds histogram$/m);
  expect(text).toMatch(/^stasis_provider_failures_total\{host="cli-host"\} \d+$/m);
});

test('run start examples/approval.json, run list --waiting, approve, and the Run completes (--json parses)', async () => {
  const { runId } = await json<{ runId: string }>('run', 'start', path.join(EXAMPLES, 'approval.json'));
  const waiting = await eventually(
    async () => {
      const { runs } = await json<{ runs: RunSnapshot[] }>('run', 'list', '--waiting');
      return runs.find((r) => r.runId === runId);
    },
    60_000,
    'the Run in run list --waiting',
  );
  expect(waiting.interactions).toEqual([
    expect.objectContaining({ id: 'int-1', status: 'pending', prompt: 'Publish release-notes.md for 1.4.0?' }),
  ]);
  // `--as` is gone: a name cannot be chosen, the one who runs the command answers.
  const forged = await stasis('approve', runId, 'int-1', '--as', 'ana');
  expect(forged.code).not.toBe(0);
  expect(forged.stderr).toContain("unknown option '--as'");
  const answered = await json<InteractionRequest>('approve', runId, 'int-1', '--comment', 'ship it');
  expect(answered).toMatchObject({
    status: 'answered',
    respondedBy: os.userInfo().username,
    response: { decision: 'approve', comment: 'ship it' },
  });
  const done = await completed(runId);
  expect(done.output).toEqual({ published: 'release-notes.md' });

  const human = await stasis('run', 'get', runId);
  expect(human.code).toBe(0);
  expect(human.stdout).toContain(`${runId}  COMPLETED`);
  expect(human.stdout).toContain('int-1  answered  approval  "Publish release-notes.md for 1.4.0?"');
});

test('human output: the waiting list says how to answer, and approve --input answers an input interaction', async () => {
  const started = await stasis('run', 'start', path.join(EXAMPLES, 'input.json'));
  expect(started.code).toBe(0);
  const runId = /^Started run (\S+)/.exec(started.stdout)?.[1] ?? '';
  expect(runId).toMatch(/^run-/);
  const listed = await waitingList(runId);
  expect(listed).toContain(`answer: stasis approve ${runId} int-1 --input <text>`);
  const answered = await stasis('approve', runId, 'int-1', '--input', 'main');
  expect({ code: answered.code, stdout: answered.stdout }).toEqual({
    code: 0,
    stdout: `Answered int-1 of ${runId} as ${os.userInfo().username}\n`,
  });
  await completed(runId);
});

test('approve --option and --edit-command: the waiting list names them, a wrong option is refused, the edited command runs', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'stasis-cli-spec-'));
  const file = path.join(dir, 'gate.json');
  writeFileSync(
    file,
    JSON.stringify({
      agent: {
        driver: 'scripted',
        steps: [
          {
            ask: 'Run the cleanup?',
            action: { command: 'echo cleanup everything' },
            options: ['tonight'],
            accepts: ['approve', 'deny', 'edit', 'option'],
          },
          { exec: 'echo cleanup everything' },
        ],
      },
      sandbox: { provider: 'local' },
    }),
  );
  const { runId } = await json<{ runId: string }>('run', 'start', file);
  const listed = await waitingList(runId);
  expect(listed).toContain(
    `answer: stasis approve ${runId} int-1 [--deny] [--edit-command <command>] [--option tonight]`,
  );
  const two = await stasis('approve', runId, 'int-1', '--deny', '--option', 'tonight');
  expect(two.code).toBe(1);
  expect(two.stderr).toContain('--deny and --option: give one kind of answer');
  const wrong = await stasis('approve', runId, 'int-1', '--option', 'now');
  expect(wrong.code).toBe(1);
  expect(wrong.stderr).toContain('INVALID_ARGUMENT: response.option: "now" is not one of the options ("tonight")');
  const edited = await stasis('approve', runId, 'int-1', '--edit-command', 'echo cleanup tmp only');
  expect({ code: edited.code, stdout: edited.stdout }).toEqual({
    code: 0,
    stdout: `Approved (edited) int-1 of ${runId} as ${os.userInfo().username}\n`,
  });
  const done = await completed(runId);
  expect(done.output).toMatchObject({ stdout: 'cleanup tmp only\n' });
});

test('agent-chosen text (a prompt, options, an output, a refusal naming the options) reaches the terminal escaped, and the answer line pasted into a shell runs nothing', async () => {
  // eslint-disable-next-line no-control-regex
  const unsafe = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'stasis-cli-evil-'));
  const marker = path.join(dir, 'pwned');
  const file = path.join(dir, 'evil.json');
  const evil = '\u001b]0;title\u0007\u009b2K\u202egood\u2066';
  writeFileSync(
    file,
    JSON.stringify({
      agent: {
        driver: 'scripted',
        steps: [
          { ask: `Pick ${evil}`, options: [`$(touch ${marker})`, `b${evil}`], accepts: ['option'] },
          { complete: `done ${evil}` },
        ],
      },
      sandbox: { provider: 'local' },
    }),
  );
  const { runId } = await json<{ runId: string }>('run', 'start', file);
  const listed = await waitingList(runId);
  expect(listed).not.toMatch(unsafe);
  const line = listed.split('\n').find((l) => l.includes('answer: '))!;
  expect(line).toBe(
    `    answer: stasis approve ${runId} int-1 [--option '$(touch ${marker})'|'b\\u001b]0;title\\u0007\\u009b2K\\u202egood\\u2066']`,
  );
  // The first choice, pasted into bash with a stand-in `stasis` that prints its arguments.
  const pasted = line.replace(/^.*answer: /, '').replace(/\[--option ('[^']*')\|.*\]$/, '--option $1');
  const words = execFileSync('bash', ['-c', `stasis() { printf '%s\\n' "$@"; }; ${pasted}`], { encoding: 'utf8' });
  expect({ words: words.split('\n'), ran: existsSync(marker) }).toEqual({
    words: ['approve', runId, 'int-1', '--option', `$(touch ${marker})`, ''],
    ran: false,
  });
  // A refusal that names the agent's options goes through the error report.
  const refused = await stasis('approve', runId, 'int-1', '--option', 'nope');
  expect(refused.code).toBe(1);
  expect(refused.stderr).toMatch(/^stasis: INVALID_ARGUMENT: response.option: "nope" is not one of the options/);
  expect(refused.stderr.trimEnd()).not.toMatch(unsafe);
  expect((await stasis('approve', runId, 'int-1', '--option', `$(touch ${marker})`)).code).toBe(0);
  await completed(runId);
  const got = await stasis('run', 'get', runId);
  expect(got.stdout).toContain('output: "done \\u001b]0;title\\u0007\\u009b2K\\u202egood\\u2066"');
  expect(got.stdout).not.toMatch(unsafe);
});

test('whole-number options take decimal digits in their range only: anything else is a usage error naming the option', async () => {
  const cases: [string[], string][] = [
    ...['abc', '0', '-1', '2x', '1e2', ' 5', '1001'].map((v): [string[], string] => [
      ['run', 'list', '--limit', v],
      '--limit',
    ]),
    ...['10s', '0', '1.5', ''].map((v): [string[], string] => [
      ['sandbox', 'exec', 'sbx-x', '--timeout-ms', v, '--', 'true'],
      '--timeout-ms',
    ]),
    ...['2x', '0', '1001'].map((v): [string[], string] => [['sandbox', 'list', '--page-size', v], '--page-size']),
  ];
  for (const [args, option] of cases) {
    const r = await stasis(...args);
    expect([args, r.code, r.stdout, r.stderr.includes(`option '${option} <`)]).toEqual([args, 2, '', true]);
  }
  const within = await json<{ runs: unknown[] }>('run', 'list', '--limit', '1000');
  expect(Array.isArray(within.runs)).toBe(true);
});

test('ids that cannot be Run ids: run get and approve say INVALID_ARGUMENT or NOT_FOUND naming the id, never INTERNAL', async () => {
  for (const id of ['', ' ', 'a'.repeat(2000), 'ü/..', 'run.1/x', 'run-1\u001b[2J']) {
    for (const args of [
      ['run', 'get', id],
      ['approve', id, 'int-1'],
    ]) {
      const r = await stasis(...args);
      expect([args, r.code, r.stderr]).toEqual([
        args,
        1,
        expect.stringMatching(/^stasis: INVALID_ARGUMENT: runId ".*": not a Run id \(.+\)\n$/),
      ]);
      expect(r.stderr).toContain(JSON.stringify(id.slice(0, 10)).slice(0, -1));
    }
  }
  const sandboxId = await stasis('run', 'get', 'sandbox-abc');
  expect({ code: sandboxId.code, stderr: sandboxId.stderr }).toEqual({
    code: 1,
    stderr: 'stasis: NOT_FOUND: run sandbox-abc not found\n',
  });
});

test('sandbox create, exec, suspend, resume (with progress on stderr), exec, destroy', async () => {
  const created = await json<SandboxView>('sandbox', 'create', '--env', 'WHO=cli');
  expect(created).toMatchObject({ state: 'running', provider: 'local', hostId: 'cli-host' });
  const id = created.sandboxId;
  expect(await json('sandbox', 'exec', id, 'echo "$WHO" > who.txt; cat who.txt')).toEqual({
    exitCode: 0,
    stdout: 'cli\n',
    stderr: '',
  });
  // Human exec: the command's output and exit code are the CLI's.
  const failing = await stasis('sandbox', 'exec', id, '--', 'echo', 'out;', 'echo', 'err', '>&2;', 'exit', '7');
  expect(failing).toEqual({ code: 7, stdout: 'out\n', stderr: 'err\n' });
  // With --json too: the exit code is the command's, the output is the JSON result.
  const failingJson = await stasis('sandbox', 'exec', id, '--json', '--', 'echo', 'out;', 'exit', '7');
  expect({ code: failingJson.code, result: JSON.parse(failingJson.stdout) as unknown }).toEqual({
    code: 7,
    result: { exitCode: 7, stdout: 'out\n', stderr: '' },
  });
  // The command's own output stays raw: the user asked for it.
  const raw = await stasis('sandbox', 'exec', id, '--', 'printf', "'\\033[1mbold\\n'");
  expect(raw).toEqual({ code: 0, stdout: '\u001b[1mbold\n', stderr: '' });

  const suspend = await stasis('sandbox', 'suspend', id, '--json');
  expect(suspend.code).toBe(0);
  expect(JSON.parse(suspend.stdout)).toMatchObject({ state: 'suspended', record: { state: 'RELEASED' } });
  expect(suspend.stderr).toMatch(new RegExp(`suspending sandbox ${id}: done in [0-9.]+ s`));
  const resume = await stasis('sandbox', 'resume', id, '--json');
  expect(resume.code).toBe(0);
  expect(JSON.parse(resume.stdout)).toMatchObject({ state: 'running' });
  expect(resume.stderr).toMatch(
    new RegExp(`restoring sandbox ${id} \\([0-9.]+ (B|KiB|MiB) checkpoint\\): done in [0-9.]+ s`),
  );
  expect(await json('sandbox', 'exec', id, 'cat who.txt')).toMatchObject({ stdout: 'cli\n' });

  const got = await stasis('sandbox', 'get', id);
  expect(got.stdout).toContain(`${id}  running  (local on cli-host)`);
  expect(await json<SandboxView>('sandbox', 'destroy', id)).toMatchObject({ state: 'destroyed' });
  const gone = await stasis('sandbox', 'get', id, '--json');
  expect(gone.code).toBe(1);
  expect(JSON.parse(gone.stdout)).toMatchObject({ error: { code: 'NOT_FOUND' } });
});

test('metrics: the snapshot as JSON and as text', async () => {
  const metrics = await json<MetricsSnapshot>('metrics');
  for (const key of [
    'active',
    'retained',
    'pendingCleanup',
    'releaseBlocked',
    'failures',
    'retries',
    'oldestBlockedAgeSeconds',
  ] as const) {
    expect(typeof metrics[key]).toBe('number');
  }
  expect(metrics.releaseLatencyMs).toEqual({
    count: expect.any(Number),
    p50: expect.any(Number),
    p95: expect.any(Number),
    max: expect.any(Number),
  });
  const human = await stasis('metrics');
  expect(human.stdout).toMatch(/^release blocked\s+\d+ \(oldest \d+ s\)$/m);
});

test('errors: a refused operation exits 1, a bad variable or usage exits 2', async () => {
  const missing = await stasis('run', 'get', 'run-missing');
  expect(missing.code).toBe(1);
  expect(missing.stderr).toMatch(/^stasis: NOT_FOUND: run run-missing not found/);
  const missingJson = await stasis('run', 'get', 'run-missing', '--json');
  expect(JSON.parse(missingJson.stdout)).toMatchObject({ error: { code: 'NOT_FOUND' } });
  const noFile = await stasis('run', 'start', path.join(EXAMPLES, 'nope.json'));
  expect(noFile.code).toBe(1);
  expect(noFile.stderr).toContain('INVALID_ARGUMENT: spec: cannot read');
  const badSpec = await stasis('run', 'start', path.join(CLI.cwd, 'package.json'));
  expect(badSpec.code).toBe(1);
  expect(badSpec.stderr).toMatch(/INVALID_ARGUMENT: spec: .*agent/);

  const badEnv = await runStasis(['run', 'list'], {
    ...env,
    TEMPORAL_ADDRESS: 'not an address',
    STASIS_WORKER_METRICS_ADDR: 'nowhere',
  });
  expect(badEnv.code).toBe(2);
  expect(badEnv.stderr).toContain('TEMPORAL_ADDRESS: must be host:port (got "not an address")');
  expect(badEnv.stderr).toContain('STASIS_WORKER_METRICS_ADDR: must be host:port or off (got "nowhere")');
  const usage = await stasis('approve', 'run-x');
  expect(usage.code).toBe(2);
  expect(usage.stderr).toContain("missing required argument 'interactionId'");
  const metricsBusy = await runStasis(['worker'], {
    ...env,
    STASIS_WORKER_METRICS_ADDR: env.STASIS_WORKER_METRICS_ADDR,
  });
  expect(metricsBusy.code).toBe(2);
  expect(metricsBusy.stderr).toContain(
    `STASIS_WORKER_METRICS_ADDR: cannot serve worker metrics on ${env.STASIS_WORKER_METRICS_ADDR}`,
  );
  const shortSecret = await runStasis(['api'], { ...env, STASIS_API_TOKENS: 'ops:tooShort-123' });
  expect(shortSecret.code).toBe(2);
  expect(shortSecret.stderr).toContain('STASIS_API_TOKENS: entry 1: the secret must be at least 16 characters');
  expect(shortSecret.stderr).not.toContain('tooShort-123');
  const httpBusy = await runStasis(['api'], { ...env, STASIS_API_TOKENS: 'ops:long-enough-s3cret' });
  expect(httpBusy.code).toBe(2);
  expect(httpBusy.stderr).toContain(`STASIS_HTTP_ADDR: cannot listen on ${env.STASIS_HTTP_ADDR}`);
  const noTokens = await stasis('api');
  expect(noTokens.code).toBe(2);
  expect(noTokens.stderr).toContain('STASIS_API_TOKENS: must be set');
});

test('property: a spec file with a key twice (however escaped), a __proto__ key, bytes that are not UTF-8 or a BOM is refused naming it, as REST refuses the body', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'cli-spec-'));
  const file = path.join(dir, 'spec.json');
  const refusal = async (bytes: Buffer) => {
    writeFileSync(file, bytes);
    return readSpec(file).then(
      () => undefined,
      (err: { code?: string; message?: string }) => ({ code: err.code, message: err.message }),
    );
  };
  // Each character of a key as itself or as a \uXXXX escape.
  const spelled = (key: string) =>
    fc
      .array(fc.boolean(), { minLength: key.length, maxLength: key.length })
      .map((escaped) =>
        [...key].map((c, i) => (escaped[i] ? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}` : c)).join(''),
      );
  // A key and a second spelling of it, drawn from the text's own escapes.
  const twice = fc.stringMatching(/^[a-z]{1,8}$/).chain((k) => fc.tuple(fc.constant(k), spelled(k)));
  await fc.assert(
    fc.asyncProperty(twice, fc.jsonValue({ maxDepth: 1 }), fc.jsonValue({ maxDepth: 1 }), async ([k, second], a, b) => {
      const text = `{"agent":{"driver":"scripted","${k}":${JSON.stringify(a)},"${second}":${JSON.stringify(b)}},"sandbox":{"provider":"local"}}`;
      // ("driver" is there once already: it is the key named either way.)
      expect(await refusal(Buffer.from(text))).toEqual({
        code: 'INVALID_ARGUMENT',
        message: `spec: the key ${JSON.stringify(k)} appears twice in one object (in ${file})`,
      });
    }),
    { numRuns: 100 },
  );
  await fc.assert(
    fc.asyncProperty(spelled('__proto__'), fc.jsonValue({ maxDepth: 1 }), async (proto, value) => {
      const text = `{"agent":{"driver":"scripted","steps":[{"complete":"x"}]},"sandbox":{"provider":"local","env":{"${proto}":${JSON.stringify(value)}}}}`;
      expect(await refusal(Buffer.from(text))).toEqual({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/^spec\.sandbox\.env\.__proto__: the key "__proto__" is not accepted/),
      });
    }),
    { numRuns: 50 },
  );
  // Bytes as a file may hold them, kept only when they are not UTF-8 (Node's own validator decides).
  await fc.assert(
    fc.asyncProperty(
      fc.uint8Array({ minLength: 1, maxLength: 8 }).filter((b) => !isUtf8(b)),
      async (bad) => {
        const bytes = Buffer.concat([
          Buffer.from('{"agent":{"driver":"scripted","steps":[{"complete":"'),
          bad,
          Buffer.from('"}]}}'),
        ]);
        expect(await refusal(bytes)).toEqual({
          code: 'INVALID_ARGUMENT',
          message: expect.stringMatching(/^spec: not valid UTF-8/),
        });
      },
    ),
    { numRuns: 100 },
  );
  expect((await refusal(Buffer.from('\ufeff{}')))?.message).toMatch(/^spec: starts with a byte order mark/);
  const good = '{"agent":{"driver":"scripted","steps":[{"complete":"é ✓ 🙂"}]},"sandbox":{"provider":"local"}}';
  writeFileSync(file, good);
  expect(await readSpec(file)).toEqual(JSON.parse(good));
});

test('stasis run start refuses a spec file with a key twice (exit 1, INVALID_ARGUMENT naming the key) and starts nothing', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'cli-spec-'));
  const file = path.join(dir, 'spec.json');
  // A reviewer reading the file top-down sees the first `steps`; JSON.parse kept the second.
  writeFileSync(
    file,
    '{"agent":{"driver":"scripted","steps":[{"complete":"reviewed steps"}],"steps":[{"complete":"other steps"}]},"sandbox":{"provider":"local"}}',
  );
  const before = JSON.parse((await stasis('run', 'list', '--json')).stdout) as { runs: unknown[] };
  const result = await stasis('run', 'start', file);
  expect(result.code).toBe(1);
  expect(result.stderr).toContain(`INVALID_ARGUMENT: spec: the key "steps" appears twice in one object (in ${file})`);
  const after = JSON.parse((await stasis('run', 'list', '--json')).stdout) as { runs: unknown[] };
  expect(after.runs.length).toBe(before.runs.length);
});

test('stasis api serves with configured tokens and stops on SIGTERM', async () => {
  const [port] = await freePorts(1);
  const api = spawnStasis(['api'], {
    ...env,
    STASIS_HTTP_ADDR: `127.0.0.1:${port}`,
    STASIS_API_TOKENS: 'ops:s3cret-token-0123456789',
  });
  let out = '';
  api.stdout?.on('data', (chunk: Buffer) => (out += chunk.toString('utf8')));
  const exited = new Promise<number | null>((resolve) => api.once('exit', resolve));
  await eventually(async () => out.includes('approval page:'), 60_000, 'stasis api to listen');
  expect(out).toContain(`stasis api: http://127.0.0.1:${port}/api/v1\n  approval page: http://127.0.0.1:${port}/`);
  const metrics = await fetch(`http://127.0.0.1:${port}/api/v1/metrics`, {
    headers: { authorization: 'Bearer s3cret-token-0123456789' },
  });
  expect(metrics.status).toBe(200);
  api.kill('SIGTERM');
  expect(await exited).toBe(0);
});

test('SIGTERM stops stasis dev and everything it started', async () => {
  dev.kill('SIGTERM');
  expect(await devExit).toBe(0);
  await expect(fetch(summary.pageUrl)).rejects.toThrow();
  await expect(fetch(summary.worker.metricsUrl ?? '')).rejects.toThrow();
});
