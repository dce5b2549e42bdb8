import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { buildApi } from '../../api/server';
import { sandboxListQuery, sealToken } from '../../client/sandbox-list';
import type { SandboxPage } from '../../common/schemas';
import { sandboxWorkflowId } from '../../workflows/definitions';
import { StasisClient } from '../../client';
import { StasisKind, StasisLabels, StasisStatus } from '../../workflows/search-attributes';
import { errorCode, errorMessage, listenOnLoopback, type HttpResult } from '../api/http';
import { runStasis } from '../cli/spawn';
import { eventually, saw, startStack, type TestStack } from '../helpers/stack';

// Listing what you own: GET /api/v1/sandboxes (and the client, CLI) through
// visibility, filtered by state and labels, page by page; labels on sandboxes and
// Runs as the StasisLabels search attribute. Every test labels its sandboxes with a
// suite label of its own, so other test files' sandboxes on the same server never count.

const TOKEN = { name: 'lister', secret: 'lister-secret-0123456789', role: 'operator' as const };
let stack: TestStack;
let app: FastifyInstance;
let call: (method: string, path: string) => Promise<HttpResult>;

beforeAll(async () => {
  stack = await startStack();
  app = buildApi({ client: stack.client, tokens: [TOKEN], logger: false });
  const http = await listenOnLoopback(app);
  call = (method, path) => http(method, path, { token: TOKEN.secret });
});
afterAll(async () => {
  await app?.close();
  await stack?.stop();
});

const suite = () => `suite:${randomUUID().slice(0, 8)}`;
const labelsOf = (entry: string) => ({ [entry.split(':')[0]]: entry.split(':')[1] });
const ids = (page: SandboxPage) => page.sandboxes.map((s) => s.sandboxId).sort();
const get = async (path: string): Promise<SandboxPage> => {
  const result = await call('GET', path);
  if (result.status !== 200) throw new Error(`GET ${path}: ${result.status} ${JSON.stringify(result.json)}`);
  return result.json as SandboxPage;
};

test('a sandbox keeps its labels: in its view, and as StasisLabels key:value keywords on its workflow', async () => {
  const tag = suite();
  const view = await stack.client.sandboxes.create({ provider: 'local', labels: { ...labelsOf(tag), team: 'infra' } });
  expect(view.labels).toEqual({ ...labelsOf(tag), team: 'infra' });
  expect((await stack.client.sandboxes.get(view.sandboxId)).labels).toEqual(view.labels);
  const described = await stack.temporal.workflow.getHandle(sandboxWorkflowId(view.sandboxId)).describe();
  expect(described.typedSearchAttributes.get(StasisLabels)?.slice().sort()).toEqual([tag, 'team:infra'].sort());
});

test("lists only its own task queue's sandboxes: another deployment's in the same namespace is not listed", async () => {
  const tag = suite();
  const ours = await stack.client.sandboxes.create({ provider: 'local', labels: labelsOf(tag) });
  // Another deployment's sandbox (its own task queue, no worker here): listed by visibility as ours are.
  const theirs = `other-${randomUUID().slice(0, 8)}`;
  const handle = await stack.temporal.workflow.start('sandboxWorkflow', {
    taskQueue: `other-deployment-${randomUUID().slice(0, 8)}`,
    workflowId: sandboxWorkflowId(theirs),
    args: [],
    typedSearchAttributes: [
      { key: StasisKind, value: 'sandbox' },
      { key: StasisStatus, value: 'created' },
      { key: StasisLabels, value: [tag] },
    ],
  });
  try {
    // Visibility has both (so the list could show both) before the list is read.
    await eventually(async () => {
      let n = 0;
      for await (const _ of stack.temporal.workflow.list({ query: `StasisLabels = '${tag}'` })) n += 1;
      return n === 2;
    });
    const page = await stack.client.sandboxes.list({ label: [tag] });
    expect(ids(page)).toEqual([ours.sandboxId]);
    expect(ids(await get(`/api/v1/sandboxes?label=${tag}`))).toEqual([ours.sandboxId]);
  } finally {
    await handle.terminate();
  }
});

test('a task queue a worker could not poll is INVALID_ARGUMENT naming taskQueue, before anything is asked', () => {
  for (const taskQueue of ["a'b", 'a b', '', 'é'])
    expect(() => new StasisClient(stack.temporal, { taskQueue })).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^taskQueue: /) }),
    );
});

test('filters by state and by every label given, over REST and the client', async () => {
  const tag = suite();
  const make = async (labels: Record<string, string>, start: boolean) => {
    const { sandboxId } = await stack.client.sandboxes.create({
      provider: 'local',
      labels: { ...labelsOf(tag), ...labels },
    });
    if (start) await stack.client.sandboxes.start(sandboxId);
    return sandboxId;
  };
  const infraRunning = await make({ team: 'infra' }, true);
  const infraCreated = await make({ team: 'infra' }, false);
  const webRunning = await make({ team: 'web', tier: 'gold' }, true);
  const q = `label=${encodeURIComponent(tag)}`;

  await eventually(
    async () => saw(ids(await get(`/api/v1/sandboxes?${q}&state=running`))).length === 2,
    30_000,
    'visibility',
  );
  expect(ids(await get(`/api/v1/sandboxes?${q}`))).toEqual([infraRunning, infraCreated, webRunning].sort());
  expect(ids(await get(`/api/v1/sandboxes?${q}&label=team:infra`))).toEqual([infraRunning, infraCreated].sort());
  expect(ids(await get(`/api/v1/sandboxes?${q}&label=team:infra&state=running`))).toEqual([infraRunning]);
  expect(ids(await get(`/api/v1/sandboxes?${q}&label=team:web&label=tier:gold`))).toEqual([webRunning]);
  expect(ids(await get(`/api/v1/sandboxes?${q}&label=team:web&label=tier:silver`))).toEqual([]);
  expect(ids(await get(`/api/v1/sandboxes?${q}&state=created`))).toEqual([infraCreated]);
  const page = await stack.client.sandboxes.list({ label: [tag, 'team:web'] });
  expect(page).toEqual({
    sandboxes: [
      {
        sandboxId: webRunning,
        state: 'running',
        provider: 'local',
        hostId: 'host-a',
        resourceState: 'ACTIVE',
        labels: { ...labelsOf(tag), team: 'web', tier: 'gold' },
        createdAt: expect.any(String),
      },
    ],
  });

  // A destroyed sandbox leaves the default list; state=destroyed still finds it.
  await stack.client.sandboxes.destroy(infraCreated);
  await eventually(
    async () => !saw(ids(await get(`/api/v1/sandboxes?${q}`))).includes(infraCreated),
    30_000,
    'destroyed to leave',
  );
  expect(ids(await get(`/api/v1/sandboxes?${q}&state=destroyed`))).toEqual([infraCreated]);
});

test('pages through every sandbox exactly once with nextPageToken, and says when there is no more', async () => {
  const tag = suite();
  const created: string[] = [];
  for (let i = 0; i < 5; i += 1)
    created.push((await stack.client.sandboxes.create({ provider: 'local', labels: labelsOf(tag) })).sandboxId);
  const q = `label=${encodeURIComponent(tag)}`;
  await eventually(async () => saw(ids(await get(`/api/v1/sandboxes?${q}`))).length === 5, 30_000, 'visibility');

  for (const pageSize of [1, 2, 5]) {
    const seen: string[] = [];
    let token: string | undefined;
    let pages = 0;
    do {
      const page = await get(`/api/v1/sandboxes?${q}&pageSize=${pageSize}${token ? `&nextPageToken=${token}` : ''}`);
      expect(page.sandboxes.length).toBeLessThanOrEqual(pageSize);
      seen.push(...ids(page));
      token = page.nextPageToken;
      pages += 1;
    } while (token && pages < 10);
    expect({ pageSize, seen: seen.sort() }).toEqual({ pageSize, seen: created.sort() });
  }
  // The client pages the same way.
  const first = await stack.client.sandboxes.list({ label: [tag], pageSize: 3 });
  expect(first.sandboxes).toHaveLength(3);
  const rest = await stack.client.sandboxes.list({ label: [tag], pageSize: 3, nextPageToken: first.nextPageToken });
  expect([...ids(first), ...ids(rest)].sort()).toEqual(created.sort());
});

test('a bad filter is a 400 naming it, over REST and the client', async () => {
  const bad: [string, RegExp][] = [
    ['state=sleeping', /query\.state/],
    ['label=nocolon', /label.*key:value/],
    ['label=bad%20key:v', /label.*label key/],
    ['label=team:has%20space', /label.*label value/],
    ['label=:novalue', /label.*key:value/],
    ['pageSize=0', /pageSize/],
    ['pageSize=1001', /pageSize/],
    ['pageSize=ten', /pageSize/],
    ['nextPageToken=not%20a%20token', /nextPageToken/],
    ['nextPageToken=AAAAAAAAAAAA', /nextPageToken/],
    // A real token, but of another list: its filters differ.
    [
      `nextPageToken=${(await stack.client.sandboxes.list({ pageSize: 1 })).nextPageToken}&state=running`,
      /nextPageToken/,
    ],
    ['status=running', /status/],
  ];
  // A real token of this very list, damaged as a bad copy does (cut short, bytes added, one changed),
  // is refused before Temporal sees it: Temporal answered such a token with a 500.
  const tag = suite();
  for (let i = 0; i < 3; i += 1) await stack.client.sandboxes.create({ provider: 'local', labels: labelsOf(tag) });
  const q = `label=${encodeURIComponent(tag)}&pageSize=1`;
  const real = await eventually(
    async () => (await get(`/api/v1/sandboxes?${q}`)).nextPageToken,
    30_000,
    'a page with a token',
  );
  const changed = `${real.slice(0, 12)}${real[12] === 'A' ? 'B' : 'A'}${real.slice(13)}`;
  for (const damaged of [real.slice(0, -4), real.slice(0, 20), `${real}AAAA`, `${real}A`, changed])
    bad.push([`${q}&nextPageToken=${damaged}`, /nextPageToken/]);
  // Forged: the seal's digest holds no secret, so one made over other bytes passes the seal and reaches
  // Temporal, which fails it as UNKNOWN ("something went wrong"); that was a 500. (Bytes Temporal takes
  // as a token, such as any JSON object to its SQL visibility, are a token.)
  const query = sandboxListQuery(stack.config.STASIS_TASK_QUEUE, { label: [tag.split(':') as [string, string]] });
  const inner = Buffer.from(real, 'base64url').subarray(16);
  // One case only: the client retries UNKNOWN for ~20 s before the answer (see listsWithoutToken).
  const forged = Buffer.from(inner);
  forged[forged.length >> 1] ^= 0x55;
  bad.push([`${q}&nextPageToken=${sealToken(forged, query)}`, /nextPageToken/]);
  for (const [query, names] of bad) {
    const result = await call('GET', `/api/v1/sandboxes?${query}`);
    expect({ query, status: result.status, code: errorCode(result) }).toEqual({
      query,
      status: 400,
      code: 'INVALID_ARGUMENT',
    });
    expect({ query, message: errorMessage(result) }).toEqual({ query, message: expect.stringMatching(names) });
  }
  await expect(stack.client.sandboxes.list({ label: ['nocolon'] })).rejects.toMatchObject({
    code: 'INVALID_ARGUMENT',
    message: expect.stringMatching(/filter: label\.0.*key:value/),
  });
  const tooMany = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, 'v']));
  const refused = await stack.client.sandboxes
    .create({ provider: 'local', labels: tooMany })
    .catch((err: Error) => err);
  expect(refused).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/labels.*at most 32/) });
  const colonKey = await stack.client.sandboxes
    .create({ provider: 'local', labels: { 'a:b': 'c' } })
    .catch((err: Error) => err);
  expect(colonKey).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/labels\.a:b/) });
});

test('`stasis sandbox list` filters and pages like the API', async () => {
  const tag = suite();
  const a = await stack.client.sandboxes.create({ provider: 'local', labels: labelsOf(tag) });
  const b = await stack.client.sandboxes.create({ provider: 'local', labels: labelsOf(tag) });
  await eventually(
    async () => saw(ids(await get(`/api/v1/sandboxes?label=${tag}`))).length === 2,
    30_000,
    'visibility',
  );
  const env = {
    ...process.env,
    STASIS_TASK_QUEUE: stack.config.STASIS_TASK_QUEUE,
    STASIS_DATA_DIR: stack.config.STASIS_DATA_DIR,
  };
  const first = await runStasis(['sandbox', 'list', '--label', tag, '--page-size', '1', '--json'], env);
  expect(first.code).toBe(0);
  const page = JSON.parse(first.stdout) as SandboxPage;
  expect(page.sandboxes).toHaveLength(1);
  const second = await runStasis(
    ['sandbox', 'list', '--label', tag, '--page-token', page.nextPageToken ?? '', '--json'],
    env,
  );
  expect([...ids(page), ...ids(JSON.parse(second.stdout) as SandboxPage)].sort()).toEqual(
    [a.sandboxId, b.sandboxId].sort(),
  );
  const text = await runStasis(['sandbox', 'list', '--label', tag, '--state', 'created'], env);
  expect(text.stdout).toContain(`${a.sandboxId}  created  (local on host-a)  ${tag}`);
  const wrong = await runStasis(['sandbox', 'list', '--state', 'sleeping'], env);
  expect({ code: wrong.code, stderr: wrong.stderr }).toEqual({
    code: expect.not.stringMatching(/^0$/),
    stderr: expect.stringMatching(/state/),
  });
});

test('Run labels are searchable too, a child Run publishing its own', async () => {
  const tag = suite();
  const { runId } = await stack.client.runs.start({
    agent: {
      driver: 'scripted',
      steps: [
        {
          spawn: {
            agent: { driver: 'scripted', steps: [{ complete: 'child' }] },
            sandbox: { provider: 'local' },
            labels: { ...labelsOf(tag), role: 'child' },
          },
        },
        { complete: 'parent' },
      ],
    },
    sandbox: { provider: 'local' },
    labels: { ...labelsOf(tag), role: 'parent' },
  });
  await stack.temporal.workflow.getHandle(runId).result();
  const found = await eventually(
    async () => {
      const seen: string[] = [];
      for await (const wf of stack.temporal.workflow.list({ query: `StasisLabels = '${tag}'` }))
        seen.push(wf.workflowId);
      return saw(seen).length === 2 ? seen.sort() : undefined;
    },
    30_000,
    'both Runs in visibility',
  );
  expect(found).toEqual([runId, `${runId}.child-1`].sort());
  const child = await stack.temporal.workflow.getHandle(`${runId}.child-1`).describe();
  expect(child.typedSearchAttributes.get(StasisLabels)?.slice().sort()).toEqual([tag, 'role:child'].sort());
});
