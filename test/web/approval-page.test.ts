import { mkdirSync } from 'node:fs';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { BrowserContext, Page } from 'playwright-core';
import { buildApi } from '../../api/server';
import { eventually, startStack, type TestStack } from '../helpers/stack';
import { launchBrowser } from './browser';

// The approval page end to end in headless Chromium, against the real worker,
// signed in with an approver token: the least role, and all the page needs.

const TOKEN = 'ops-secret-5a1f2e';
const ARTIFACTS = path.join(__dirname, '..', '..', 'test-artifacts');

let stack: TestStack;
let app: FastifyInstance;
let base: string;
let browser: { context: BrowserContext; close(): Promise<void> };

beforeAll(async () => {
  stack = await startStack();
  app = buildApi({ client: stack.client, tokens: [{ name: 'ops', secret: TOKEN, role: 'approver' }], logger: false });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  base = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
  browser = await launchBrowser();
});

afterAll(async () => {
  await browser?.close();
  await app?.close();
  await stack?.stop();
});

const interaction = (page: Page, runId: string, id: string) =>
  page.locator(`li.run[data-run-id="${runId}"] li.interaction[data-interaction-id="${id}"]`);

const askSpec = (...steps: unknown[]) => ({ agent: { driver: 'scripted', steps }, sandbox: { provider: 'local' } });

/** Waits for the Run to complete and returns its snapshot. */
const completed = (runId: string) =>
  eventually(
    async () => {
      const snapshot = await stack.client.runs.get(runId);
      return snapshot.status === 'COMPLETED' && snapshot;
    },
    60_000,
    'the Run to complete',
  );

test('sign in, see a new interaction appear without reload, approve it, and the Run completes', async () => {
  const page = await browser.context.newPage();
  await page.goto(`${base}/`);
  await page.getByLabel('API token').fill(TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#waiting').waitFor();

  // Started after the page loaded: it must show up by itself.
  const { runId } = await stack.client.runs.start(
    askSpec({ ask: 'Deploy web-42 to production?' }, { complete: { deployed: 'web-42' } }),
  );
  const item = interaction(page, runId, 'int-1');
  await item.waitFor({ timeout: 60_000 });
  await expectText(item.locator('.prompt'), 'Deploy web-42 to production?');
  await expectText(item.locator('.meta'), /asks for approval · asked (just now|\d+ s ago)/);
  await expectVisible(item.getByRole('button', { name: 'Deny' }));

  // The operator view (resource record, sandbox id) stays off the page.
  const resource = await stack.client.runs.resource(runId);
  const pageText = await page.locator('body').innerText();
  expect(pageText).not.toContain(resource.record.sandboxId);
  expect(pageText).not.toMatch(/RELEASE|RETAINED|fence/);

  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'approval-page.png'), fullPage: true });

  await item.getByRole('button', { name: 'Approve' }).click();
  await expectText(page.locator('#notice'), `Approved: “Deploy web-42 to production?” (${runId})`);
  const done = await completed(runId);
  expect(done.output).toEqual({ deployed: 'web-42' });
  expect(done.interactions[0]).toMatchObject({
    status: 'answered',
    respondedBy: 'ops',
    response: { decision: 'approve' },
  });
  await item.waitFor({ state: 'detached' });
  await page.close();
});

test('a ?token= link signs in and leaves the address bar; a refused answer says someone else answered first; input is sent', async () => {
  const { runId } = await stack.client.runs.start(
    askSpec({ ask: 'Merge PR 7?' }, { ask: 'Release name?', kind: 'input' }, { complete: 'released' }),
  );
  await eventually(async () => (await stack.client.runs.get(runId)).status === 'WAITING', 60_000, 'WAITING');

  const page = await browser.context.newPage();
  // Timers under the test's control: the page shows what it loaded until we let it poll.
  await page.clock.install();
  await page.goto(`${base}/?token=${TOKEN}`);
  expect(page.url()).toBe(`${base}/`);
  expect(await page.evaluate('sessionStorage.getItem("stasis.token")')).toBe(TOKEN);
  const first = interaction(page, runId, 'int-1');
  await first.waitFor();

  // Someone else answers while this page still offers the buttons.
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' }, { respondedBy: 'someone-else' });
  await first.getByRole('button', { name: 'Approve' }).click();
  await expectText(
    page.locator('#notice'),
    /Someone else answered first: “Merge PR 7\?”.*Your answer was not recorded\./,
  );
  // The refusal refreshes the list at once: the question answered elsewhere goes.
  await first.waitFor({ state: 'detached' });

  // Let it poll until the next question comes.
  const second = interaction(page, runId, 'int-2');
  await eventually(
    async () => {
      await page.clock.runFor(1_600);
      return (await second.count()) === 1;
    },
    60_000,
    'the input interaction',
  );
  await expectText(second.locator('.meta'), /asks for input/);
  await second.getByLabel('Answer').fill('v1.4.0');
  await second.getByRole('button', { name: 'Send' }).click();
  await expectText(page.locator('#notice'), `Answered: “Release name?” (${runId})`);
  const done = await completed(runId);
  expect(done.interactions[1]).toMatchObject({ respondedBy: 'ops', response: { input: 'v1.4.0' } });
  expect(done.interactions[0]).toMatchObject({ respondedBy: 'someone-else' });
  await page.close();
});

test('a wrong token is refused and the sign-in form comes back', async () => {
  const page = await browser.context.newPage();
  await page.goto(`${base}/`);
  await page.getByLabel('API token').fill('not-a-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expectText(page.locator('#sign-in-error'), 'The token was refused. Sign in again.');
  await expectVisible(page.getByRole('button', { name: 'Sign in' }));
  expect(await page.evaluate('sessionStorage.getItem("stasis.token")')).toBeNull();
  await page.close();
});

async function expectText(locator: ReturnType<Page['locator']>, expected: string | RegExp): Promise<void> {
  await eventually(
    async () => {
      const text = await locator.innerText();
      return typeof expected === 'string' ? text === expected : expected.test(text);
    },
    20_000,
    `text ${String(expected)}`,
  );
}

async function expectVisible(locator: ReturnType<Page['locator']>): Promise<void> {
  await locator.waitFor({ state: 'visible' });
}
