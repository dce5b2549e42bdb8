// A small external agent for Stasis: plain Node.js (20+) and fetch against the
// REST API, no Stasis code. A real agent would ask a model what to do next; this
// one follows a fixed plan so the loop around it is easy to see:
//
//   write a script → run it → ask a person before "publishing" → publish → read
//   the result → complete.
//
// Run it (see README.md):
//   STASIS_API_URL=http://127.0.0.1:8080 STASIS_API_TOKEN=<operator secret> \
//     node --experimental-strip-types examples/external-agent/agent.ts

type Json = Record<string, unknown>;

interface ActionView {
  actionId: string;
  status: 'running' | 'waiting' | 'succeeded' | 'failed';
  interactionId?: string;
  result?: Json;
  error?: { code: string; message: string };
}

const API = (process.env.STASIS_API_URL ?? 'http://127.0.0.1:8080').replace(/\/+$/, '');
const TOKEN = process.env.STASIS_API_TOKEN ?? '';
const PROVIDER = process.env.STASIS_PROVIDER ?? 'local';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** One HTTP call; network errors and 5xx are retried (the same request, so the same actionId). */
async function call(method: string, path: string, body?: unknown): Promise<{ status: number; json: Json }> {
  for (let attempt = 1; ; attempt++) {
    try {
      const response = await fetch(`${API}${path}`, {
        method,
        headers: { authorization: `Bearer ${TOKEN}`, ...(body ? { 'content-type': 'application/json' } : {}) },
        ...(body ? { body: JSON.stringify(body) } : {}),
      });
      const json = (await response.json()) as Json;
      if (response.status < 500) return { status: response.status, json };
      if (attempt >= 5) throw new Error(`${method} ${path}: ${response.status} ${JSON.stringify(json)}`);
    } catch (err) {
      if (attempt >= 5) throw err;
    }
    await sleep(500 * attempt);
  }
}

/**
 * Sends one action and returns its outcome. A retry after a lost answer is safe:
 * Stasis runs an actionId once and answers a repeat with the same outcome. A 202
 * means it is still under way (or a person has to answer an ask): poll for it.
 */
async function act(runId: string, actionId: string, action: Json): Promise<ActionView> {
  const sent = await call('POST', `/api/v1/runs/${runId}/actions`, { actionId, action });
  if (sent.status >= 400) throw new Error(`${actionId}: ${sent.status} ${JSON.stringify(sent.json)}`);
  let view = sent.json as unknown as ActionView;
  if (view.status === 'waiting')
    console.log(
      `  waiting for a person to answer ${view.interactionId} (the page, or: stasis approve ${runId} ${view.interactionId})`,
    );
  while (view.status === 'running' || view.status === 'waiting') {
    await sleep(view.status === 'waiting' ? 2_000 : 500);
    view = (await call('GET', `/api/v1/runs/${runId}/actions/${actionId}`)).json as unknown as ActionView;
  }
  if (view.status === 'failed') throw new Error(`${actionId} failed: ${view.error?.code} ${view.error?.message}`);
  console.log(`  ${actionId}: ${JSON.stringify(view.result)}`);
  return view;
}

async function main(): Promise<void> {
  let runId = process.env.STASIS_RUN_ID;
  if (!runId) {
    const started = await call('POST', '/api/v1/runs', {
      agent: { driver: 'external' },
      sandbox: { provider: PROVIDER },
      labels: { example: 'external-agent' },
    });
    if (started.status !== 201) throw new Error(`start: ${started.status} ${JSON.stringify(started.json)}`);
    runId = started.json.runId as string;
  }
  console.log(`run ${runId}`);

  await act(runId, 'write-script', {
    type: 'writeFile',
    path: 'greet.sh',
    content: 'echo "hello from $(basename "$PWD")"\n',
  });
  const tried = await act(runId, 'try-script', { type: 'exec', command: 'sh greet.sh' });
  if (tried.result?.exitCode !== 0) throw new Error('the script does not run');

  const publish = 'sh greet.sh > greeting.txt';
  const answer = await act(runId, 'ask-publish', {
    type: 'ask',
    ask: 'Publish the greeting?',
    title: 'Publish greeting.txt',
    details: `The script printed:\n\n    ${String(tried.result?.stdout).trim()}`,
    action: { command: publish, files: ['greeting.txt'] },
  });
  const decision = answer.result?.decision;
  if (decision === 'deny') {
    await act(runId, 'give-up', {
      type: 'fail',
      code: 'DENIED',
      message: `denied: ${String(answer.result?.comment ?? '')}`,
    });
    return;
  }
  // An edit approves with other arguments: run what the person wrote.
  const command = (answer.result?.action as { command?: string } | undefined)?.command ?? publish;
  await act(runId, 'publish', { type: 'exec', command });
  const read = await act(runId, 'read-greeting', { type: 'readFile', path: 'greeting.txt' });
  await act(runId, 'done', { type: 'complete', output: { greeting: read.result?.content } });
  // The Run settles its sandbox (and any children) before it says COMPLETED.
  let status = 'RUNNING';
  while (status === 'RUNNING') {
    await sleep(500);
    status = (await call('GET', `/api/v1/runs/${runId}`)).json.status as string;
  }
  console.log(`run ${runId} ${status}`);
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
