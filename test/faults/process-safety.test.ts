import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { sandboxProcesses } from '../../providers/processes';
import { eventually, startStack, type TestStack } from '../helpers/stack';
import { Tally, writeSummary } from './helpers';

// Area 8, process safety: hostile sandboxes and hostile requests against the process
// starter, the host and the neighbours, on the real stack (Temporal, the worker, both
// providers). An escape is anything getting past a defence: a neighbour's job failing
// because of another's request, a fake bwrap run on the host, a process that hid or
// forged its sandbox marker surviving a stop or being stopped as another's, a fork bomb
// past its limit. Every trial is bounded, so on a host without the defences it fails
// without taking the machine down.

const HOST = 'host-a';
let stack: TestStack;
const tally = new Tally();
let escapes = 0;

beforeAll(async () => {
  stack = await startStack({ hostId: HOST });
}, 120_000);
afterAll(async () => {
  await stack?.stop();
});

const workspaceOf = (sandboxId: string) =>
  path.join(stack.config.STASIS_DATA_DIR, 'hosts', HOST, 'sandboxes', sandboxId, 'volume', 'workspace');
const counter = (sandboxId: string, file: string) => {
  try {
    return Number(readFileSync(path.join(workspaceOf(sandboxId), file), 'utf8').trim() || '0');
  } catch {
    return 0;
  }
};
const processCount = async (sandboxId: string) => (await sandboxProcesses({ sandboxId, hostId: HOST })).length;

async function sandbox(provider: string, extra: Record<string, unknown> = {}): Promise<string> {
  const { sandboxId } = await stack.client.sandboxes.create({ provider, ...extra });
  await stack.client.sandboxes.start(sandboxId);
  return sandboxId;
}

/** Runs one trial: `attack` resolves to whether the attack got through. */
async function trial(id: string, attack: () => Promise<boolean>): Promise<void> {
  tally.start(id, `${id}: not verified`);
  tally.inject();
  const escaped = await attack();
  if (escaped) escapes += 1;
  expect({ id, escaped }).toEqual({ id, escaped: false });
  tally.ok(id);
}

/** A counting loop detached from its exec; under bwrap it lives as long as the exec, which sleeps on. */
// The count is renamed into place: a read between `>`'s truncation and its write saw an empty file
// (0), which read as a loop that had stopped (a false escape under load).
const loop = (file: string, env: string) =>
  `${env} setsid nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > ${file}.t; mv -f ${file}.t ${file}; sleep 0.02; done' >/dev/null 2>&1 &\nsleep 600`;

describe.each(['local', 'bwrap'])('%s', (provider) => {
  test('hostile exec requests fail alone: a neighbour’s job in flight finishes', async () => {
    const neighbour = await sandbox(provider);
    const attacker = await sandbox(provider);
    const attacks: [string, Record<string, unknown>, (err: unknown, result?: { stdout: string }) => boolean][] = [
      // Refused at the edge, naming the field.
      [
        'a NUL byte in the command',
        { command: 'echo a\0b' },
        (err) => (err as { code?: string })?.code !== 'INVALID_ARGUMENT',
      ],
      [
        'an environment value over 128 KiB',
        { command: 'true', env: { BIG: 'x'.repeat(200 * 1024) } },
        (err) => !String((err as Error)?.message).includes('env.BIG'),
      ],
      // Not an attack any more: a long command reaches the shell on stdin.
      [
        'a 300 KiB command',
        { command: `x='${'y'.repeat(300 * 1024)}'; echo \${#x}` },
        (err, result) => err !== undefined || result?.stdout !== `${300 * 1024}\n`,
      ],
    ];
    for (const [what, input, escaped] of attacks) {
      await trial(`${provider}: ${what}`, async () => {
        const job = stack.client.sandboxes.exec(neighbour, { command: 'sleep 1; echo done' });
        await sleep(200);
        const outcome = await stack.client.sandboxes.exec(attacker, input).then(
          (result) => ({ result, err: undefined }),
          (err: unknown) => ({ result: undefined, err }),
        );
        const neighbourDone = await job.then(
          (r) => r.stdout === 'done\n',
          () => false,
        );
        return escaped(outcome.err, outcome.result) || !neighbourDone;
      });
    }
    for (const id of [neighbour, attacker]) await stack.client.sandboxes.destroy(id);
  }, 180_000);

  test('a process that hides its marker is stopped with its sandbox; one that forges a neighbour’s is not the neighbour’s', async () => {
    const hider = await sandbox(provider);
    const victim = await sandbox(provider);
    const forger = await sandbox(provider);
    void stack.client.sandboxes
      .exec(hider, { command: loop('hidden', 'env -u STASIS_SANDBOX_ID -u STASIS_SANDBOX_HOST') })
      .catch(() => undefined);
    void stack.client.sandboxes
      .exec(forger, { command: loop('forged', `env STASIS_SANDBOX_ID=${victim} STASIS_SANDBOX_HOST=${HOST}`) })
      .catch(() => undefined);
    await eventually(async () => counter(hider, 'hidden') > 3 && counter(forger, 'forged') > 3, 30_000, 'both loops');

    await trial(`${provider}: a process without its marker`, async () => {
      await stack.client.sandboxes.stop(hider);
      const stopped = counter(hider, 'hidden');
      await sleep(300);
      return counter(hider, 'hidden') !== stopped || (await processCount(hider)) !== 0;
    });
    await trial(`${provider}: a process with a neighbour’s marker`, async () => {
      // Neither frozen with the victim nor killed with it: it is the forger's.
      await stack.client.sandboxes.pause(victim);
      const paused = counter(forger, 'forged');
      await sleep(300);
      const frozenToo = counter(forger, 'forged') <= paused;
      await stack.client.sandboxes.resume(victim);
      await stack.client.sandboxes.stop(victim);
      const stopped = counter(forger, 'forged');
      await sleep(300);
      return frozenToo || counter(forger, 'forged') <= stopped || (await processCount(victim)) !== 0;
    });
    for (const id of [hider, victim, forger]) await stack.client.sandboxes.destroy(id);
  }, 180_000);

  test('a fork bomb stays within its sandbox’s process limit; a neighbour still runs commands', async () => {
    const bomb = await sandbox(provider, { limits: { processes: 64 } });
    const neighbour = await sandbox(provider);
    void stack.client.sandboxes
      .exec(bomb, { command: 'for i in $(seq 400); do sleep 60 & done; sleep 600' })
      .catch(() => undefined);
    await trial(`${provider}: a fork bomb`, async () => {
      await eventually(async () => (await processCount(bomb)) >= 50, 60_000, 'the bomb to fill its sandbox');
      let most = 0;
      for (let i = 0; i < 10; i += 1) {
        most = Math.max(most, await processCount(bomb));
        await sleep(100);
      }
      const alive = await stack.client.sandboxes.exec(neighbour, { command: 'echo alive' });
      return most > 64 || alive.stdout !== 'alive\n';
    });
    for (const id of [bomb, neighbour]) await stack.client.sandboxes.destroy(id);
  }, 180_000);
});

test('bwrap: a PATH into the workspace does not make the host run the workspace’s bwrap', async () => {
  const outside = mkdtempSync(path.join(os.tmpdir(), 'stasis-outside-'));
  const id = await sandbox('bwrap', { env: { PATH: './bin:/usr/bin:/bin' } });
  await stack.client.sandboxes.writeFile(id, 'bin/bwrap', Buffer.from(`#!/bin/sh\necho escaped > ${outside}/pwned\n`));
  await stack.client.sandboxes.exec(id, { command: 'chmod +x bin/bwrap' });
  await trial('bwrap: PATH=./bin', async () => {
    const outcome = await stack.client.sandboxes.exec(id, { command: 'echo inside', env: { PATH: './bin:/usr/bin' } });
    return existsSync(path.join(outside, 'pwned')) || outcome.stdout !== 'inside\n';
  });
  await stack.client.sandboxes.destroy(id);
}, 120_000);

test('summary: no attack got through', () => {
  writeSummary('process-safety', tally, { escapes });
  expect(tally.lostItems).toEqual([]);
  expect(escapes).toBe(0);
  expect(tally.trials).toBe(13);
});
