import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { StasisError } from '../../common/errors';
import { sandboxPaths } from '../../providers/sandbox-state';
import { eventually, startStack, type TestStack } from '../helpers/stack';
import { mountsUnder } from '../providers/helpers';
import { Tally, writeSummary } from './helpers';

// Area disk: a disk filler in a sandbox on the real stack (Temporal, the worker, both
// providers) with sandbox volumes required. Each filler writes until the disk refuses
// while a neighbour works and the worker writes files into both; then the filler is
// suspended and resumed. An escape is a byte past the filler's limit (on its volume or
// the host's disk); an item lost is a file written before the fill that did not come back.

const HOST = 'host-a';
const DISK_MIB = 64;
const MIB = 1024 * 1024;
/** KiB the filler's files take. */
const SIZE = "du -k fill fill2 | awk '{ s += $1 } END { print s }'";
let stack: TestStack;
const tally = new Tally();
let escapes = 0;

beforeAll(async () => {
  stack = await startStack({ hostId: HOST, env: { STASIS_SANDBOX_VOLUMES: 'required' } });
}, 120_000);
const made: string[] = [];
afterAll(async () => {
  // What a failed test left: its sandboxes' processes hold their volumes.
  for (const sandboxId of made) await stack?.client.sandboxes.destroy(sandboxId).catch(() => undefined);
  await stack?.stop();
});

const pathsOf = (sandboxId: string) => sandboxPaths(path.join(stack.config.STASIS_DATA_DIR, 'hosts', HOST), sandboxId);
async function sandbox(provider: string): Promise<string> {
  const { sandboxId } = await stack.client.sandboxes.create({ provider, limits: { diskMiB: DISK_MIB } });
  made.push(sandboxId);
  await stack.client.sandboxes.start(sandboxId);
  return sandboxId;
}

describe.each(['local', 'bwrap'])('%s', (provider) => {
  test('a disk filler stops at its limit; the worker and a neighbour keep working; its files survive suspend and resume', async () => {
    const id = `disk-${provider}`;
    tally.start(id, `${id}: not verified`);
    const [filler, neighbour] = [await sandbox(provider), await sandbox(provider)];
    const before = Buffer.from(`before the fill, ${filler}`);
    await stack.client.sandboxes.writeFile(filler, 'before.txt', before);

    tally.inject();
    const fill = await stack.client.sandboxes.exec(filler, {
      // Then, once written back, the blocks ext4 had held in reserve for the first file.
      command: `dd if=/dev/zero of=fill bs=1M count=${DISK_MIB * 4}; sync; cat /dev/zero > fill2; sync; ${SIZE}`,
    });
    expect(fill.stderr).toContain('No space left on device');
    const filledKiB = Number(fill.stdout.trim());
    const image = await fs.stat(pathsOf(filler).volumeImage);
    if (filledKiB * 1024 > DISK_MIB * MIB || image.blocks * 512 > DISK_MIB * MIB) escapes += 1;

    // The worker refuses a write that does not fit (413), and writes the neighbour's.
    const late = await stack.client.sandboxes.writeFile(filler, 'late.txt', Buffer.alloc(900 * 1024)).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(late).toBeInstanceOf(StasisError);
    expect(late).toMatchObject({ code: 'PAYLOAD_TOO_LARGE', message: expect.stringContaining('diskMiB') });
    await stack.client.sandboxes.writeFile(neighbour, 'n.txt', Buffer.alloc(512 * 1024, 1));
    const work = await stack.client.sandboxes.exec(neighbour, {
      command: 'head -c 8000000 /dev/zero > more; wc -c < n.txt',
    });
    expect({ exitCode: work.exitCode, stdout: work.stdout }).toEqual({ exitCode: 0, stdout: '524288\n' });

    await stack.client.sandboxes.suspend(filler);
    await stack.client.sandboxes.resume(filler);
    expect((await stack.client.sandboxes.readFile(filler, 'before.txt')).equals(before)).toBe(true);
    const after = await stack.client.sandboxes.exec(filler, { command: `${SIZE}; ls` });
    expect(after.stdout).toBe(`${filledKiB}\nbefore.txt\nfill\nfill2\n`);

    for (const sandboxId of [filler, neighbour]) await stack.client.sandboxes.destroy(sandboxId);
    // Destroyed: no mount, no image left of either.
    await eventually(
      async () =>
        !mountsUnder(stack.config.STASIS_DATA_DIR).some((point) =>
          [filler, neighbour].some((s) => point.includes(`/${s}/`)),
        ) &&
        (await fs.stat(pathsOf(filler).root).then(
          () => false,
          () => true,
        )),
      30_000,
      'the volumes of both sandboxes unmounted and deleted',
    );
    tally.ok(id);
  }, 300_000);
});

test('summary', () => {
  const line = writeSummary('disk', tally, { escapes });
  expect(line).toContain('items_lost=0');
  expect({ escapes, lost: tally.lostItems }).toEqual({ escapes: 0, lost: [] });
});
