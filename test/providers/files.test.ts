import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import * as path from 'node:path';
import * as fc from 'fast-check';
import { StasisError } from '../../common/errors';
import { readWorkspaceFile, writeWorkspaceFile } from '../../providers/files';
import { FILE_LIMIT_BYTES } from '../../common/payload-limits';
import { swapLoop, swapping, tempDir } from './helpers';

// The worker's file access to a sandbox's workspace (providers/files.ts),
// attacked directly: a model of what a path may reach (never through a link,
// only regular files) checked against random trees, a process swapping a
// directory and a link to a host directory under thousands of reads and writes,
// and FIFOs, sockets and devices named like the file asked for.

type Kind = 'dir' | 'file' | 'fifo' | 'link';
/** How the test builds a link: where it points. */
const LINK_TARGETS = ['OUTSIDE', 'OUTSIDE/secret', '/proc/self', 'a', '.', 'nowhere'] as const;

interface Entry {
  names: string[];
  kind: Kind;
  target: (typeof LINK_TARGETS)[number];
  content: string;
}

const NAMES = ['a', 'b', 'l'];
const entryArb: fc.Arbitrary<Entry> = fc.record({
  names: fc.array(fc.constantFrom(...NAMES), { minLength: 1, maxLength: 3 }),
  kind: fc.constantFrom<Kind>('dir', 'dir', 'file', 'fifo', 'link'),
  target: fc.constantFrom(...LINK_TARGETS),
  content: fc.string({ maxLength: 8 }),
});
const requestArb = fc
  .tuple(
    fc.boolean(),
    fc.array(fc.constantFrom(...NAMES, 'x', '.', '..', ''), { minLength: 1, maxLength: 4 }),
    fc.constantFrom<'read' | 'write'>('read', 'write'),
    fc.string({ maxLength: 8 }),
  )
  .map(([prefixed, names, op, content]) => ({
    path: `${prefixed ? '/workspace/' : ''}${names.join('/')}`,
    op,
    content,
  }));

/** What the workspace holds, by relative path; the model the file API is checked against. */
type Model = Map<string, { kind: Kind; content?: string }>;
type Outcome = { ok: string | true } | { code: 'INVALID_ARGUMENT' | 'NOT_FOUND' };

/** The model's answer: `..` is refused, no link is followed anywhere, only regular files are read or replaced. */
function expected(model: Model, request: { path: string; op: 'read' | 'write'; content: string }): Outcome {
  const relative = request.path.startsWith('/workspace/') ? request.path.slice('/workspace/'.length) : request.path;
  const names = relative.split('/').filter((n) => n !== '' && n !== '.');
  if (relative.startsWith('/') || names.includes('..') || names.length === 0) return { code: 'INVALID_ARGUMENT' };
  let creating = false;
  for (let i = 0; i < names.length - 1; i++) {
    const at = names.slice(0, i + 1).join('/');
    const entry = model.get(at);
    if (!entry) {
      if (request.op === 'read') return { code: 'NOT_FOUND' };
      creating = true;
      continue;
    }
    if (entry.kind !== 'dir') return { code: 'INVALID_ARGUMENT' };
  }
  const leaf = names.join('/');
  const entry = creating ? undefined : model.get(leaf);
  if (request.op === 'read') {
    if (!entry) return { code: 'NOT_FOUND' };
    return entry.kind === 'file' ? { ok: entry.content ?? '' } : { code: 'INVALID_ARGUMENT' };
  }
  if (entry && entry.kind !== 'file') return { code: 'INVALID_ARGUMENT' };
  for (let i = 0; i < names.length - 1; i++) model.set(names.slice(0, i + 1).join('/'), { kind: 'dir' });
  model.set(leaf, { kind: 'file', content: request.content });
  return { ok: true };
}

/** Builds `entries` (in order; one whose parent is not a plain directory, or that exists, is left out). */
async function build(workspace: string, outside: string, entries: Entry[]): Promise<Model> {
  const model: Model = new Map();
  for (const entry of entries) {
    const rel = entry.names.join('/');
    const parent = entry.names.slice(0, -1).join('/');
    if (model.has(rel) || (parent && model.get(parent)?.kind !== 'dir')) continue;
    const file = path.join(workspace, rel);
    if (entry.kind === 'dir') await fs.mkdir(file);
    if (entry.kind === 'file') await fs.writeFile(file, entry.content);
    if (entry.kind === 'fifo') execFileSync('mkfifo', [file]);
    if (entry.kind === 'link') await fs.symlink(entry.target.replace('OUTSIDE', outside), file);
    model.set(rel, { kind: entry.kind, ...(entry.kind === 'file' ? { content: entry.content } : {}) });
  }
  return model;
}

/** The workspace as it is (never following a link), in the model's terms. */
async function scan(workspace: string, prefix = ''): Promise<Model> {
  const found: Model = new Map();
  for (const name of await fs.readdir(path.join(workspace, prefix))) {
    const rel = prefix ? `${prefix}/${name}` : name;
    const stat = await fs.lstat(path.join(workspace, rel));
    if (stat.isDirectory()) {
      found.set(rel, { kind: 'dir' });
      for (const [k, v] of await scan(workspace, rel)) found.set(k, v);
    } else if (stat.isFile())
      found.set(rel, { kind: 'file', content: await fs.readFile(path.join(workspace, rel), 'utf8') });
    else found.set(rel, { kind: stat.isFIFO() ? 'fifo' : stat.isSymbolicLink() ? 'link' : ('other' as Kind) });
  }
  return found;
}

async function outcomeOf(workspace: string, request: { path: string; op: 'read' | 'write'; content: string }) {
  try {
    if (request.op === 'read') return { ok: (await readWorkspaceFile(workspace, request.path)).toString('utf8') };
    await writeWorkspaceFile(workspace, request.path, Buffer.from(request.content));
    return { ok: true as const };
  } catch (err) {
    if (err instanceof StasisError) return { code: err.code };
    throw err;
  }
}

async function outsideUntouched(outside: string): Promise<void> {
  expect(await fs.readdir(outside)).toEqual(['secret']);
  expect(await fs.readFile(path.join(outside, 'secret'), 'utf8')).toBe('HOST SECRET');
}

async function makeOutside(): Promise<string> {
  const outside = await tempDir('outside');
  await fs.writeFile(path.join(outside, 'secret'), 'HOST SECRET');
  return outside;
}

test('reads and writes follow the model: no link followed, only regular files, nothing outside touched', async () => {
  const outside = await makeOutside();
  await fc.assert(
    fc.asyncProperty(
      fc.array(entryArb, { maxLength: 12 }),
      fc.array(requestArb, { minLength: 1, maxLength: 12 }),
      async (entries, requests) => {
        const workspace = await tempDir('ws');
        try {
          const model = await build(workspace, outside, entries);
          for (const request of requests) {
            const want = expected(model, request);
            expect({ request, outcome: await outcomeOf(workspace, request) }).toEqual({ request, outcome: want });
          }
          // The workspace holds exactly what the model says (no temp file left, nothing else changed).
          expect(await scan(workspace)).toEqual(model);
          await outsideUntouched(outside);
        } finally {
          await fs.rm(workspace, { recursive: true, force: true });
        }
      },
    ),
    { numRuns: 150 },
  );
});

test('an active workspace (the root is the worker’s own link to a host directory) is read and written', async () => {
  const hostDir = await tempDir('host-path');
  const root = await tempDir('sandbox-root');
  await fs.symlink(hostDir, path.join(root, 'workspace'));
  await writeWorkspaceFile(path.join(root, 'workspace'), 'deep/er/notes.txt', Buffer.from('kept'));
  expect(await fs.readFile(path.join(hostDir, 'deep/er/notes.txt'), 'utf8')).toBe('kept');
  expect((await readWorkspaceFile(path.join(root, 'workspace'), '/workspace/deep/er/notes.txt')).toString()).toBe(
    'kept',
  );
});

test('a write keeps the permission bits of the file it replaces, without setuid or setgid', async () => {
  const workspace = await tempDir('ws');
  await fs.writeFile(path.join(workspace, 'run.sh'), 'old');
  await fs.chmod(path.join(workspace, 'run.sh'), 0o6755);
  await writeWorkspaceFile(workspace, 'run.sh', Buffer.from('new'));
  const stat = await fs.stat(path.join(workspace, 'run.sh'));
  expect(stat.mode & 0o7777).toBe(0o755);
  expect(await fs.readFile(path.join(workspace, 'run.sh'), 'utf8')).toBe('new');
});

test('a file of FILE_LIMIT_BYTES (what a payload carries) is read whole; one byte more is PAYLOAD_TOO_LARGE naming it', async () => {
  const workspace = await tempDir('ws');
  await fs.writeFile(path.join(workspace, 'max.bin'), '');
  await fs.truncate(path.join(workspace, 'max.bin'), FILE_LIMIT_BYTES);
  await fs.writeFile(path.join(workspace, 'over.bin'), '');
  await fs.truncate(path.join(workspace, 'over.bin'), FILE_LIMIT_BYTES + 1);
  expect((await readWorkspaceFile(workspace, 'max.bin')).length).toBe(FILE_LIMIT_BYTES);
  await expect(readWorkspaceFile(workspace, 'over.bin')).rejects.toMatchObject({
    code: 'PAYLOAD_TOO_LARGE',
    message: expect.stringContaining('"over.bin"'),
  });
});

test('refusals name the path and say why', async () => {
  const workspace = await tempDir('ws');
  const outside = await makeOutside();
  await fs.mkdir(path.join(workspace, 'dir'));
  await fs.symlink(outside, path.join(workspace, 'out'));
  execFileSync('mkfifo', [path.join(workspace, 'pipe')]);
  const cases: [string, RegExp][] = [
    ['../x', /"\.\.\/x".*\.\./],
    ['/etc/passwd', /"\/etc\/passwd".*relative/],
    ['/workspace/', /workspace itself/],
    ['dir', /"dir".*a directory/],
    ['out/secret', /"out\/secret".*out.*link/],
    ['pipe', /"pipe".*FIFO/],
    ['a\0b', /relative/],
  ];
  for (const [requested, message] of cases) {
    await expect(readWorkspaceFile(workspace, requested)).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(message),
    });
  }
  await expect(readWorkspaceFile(workspace, 'dir/missing')).rejects.toMatchObject({
    code: 'NOT_FOUND',
    message: expect.stringContaining('dir/missing'),
  });
  await outsideUntouched(outside);
});

test('a directory swapped with a link to a host directory: thousands of reads and writes, none escapes', async () => {
  const workspace = await tempDir('ws');
  const outside = await makeOutside();
  // The real directory has its own "secret"; the swap is running before the race starts.
  await fs.mkdir(path.join(workspace, 'd'));
  await fs.writeFile(path.join(workspace, 'd', 'secret'), 'INSIDE');
  const [command, ...args] = swapLoop('d', outside);
  const child = spawn(command, args, { cwd: workspace, stdio: 'ignore' });
  try {
    await swapping(path.join(workspace, 'd'));
    const counts = { reads: 0, readOk: 0, writes: 0, writeOk: 0, escapes: [] as string[] };
    const written = new Set<string>();
    await Promise.all(
      Array.from({ length: 8 }, async (_, worker) => {
        for (let i = 0; i < 500; i++) {
          if (i % 4 === 3) {
            const name = `w-${worker}-${i}`;
            counts.writes += 1;
            const outcome = await outcomeOf(workspace, { path: `d/${name}`, op: 'write', content: name });
            if ('ok' in outcome) {
              counts.writeOk += 1;
              written.add(name);
            } else expect(['INVALID_ARGUMENT', 'NOT_FOUND']).toContain(outcome.code);
          } else {
            counts.reads += 1;
            const outcome = await outcomeOf(workspace, { path: 'd/secret', op: 'read', content: '' });
            if ('ok' in outcome) {
              counts.readOk += 1;
              if (outcome.ok !== 'INSIDE') counts.escapes.push(String(outcome.ok));
            } else expect(['INVALID_ARGUMENT', 'NOT_FOUND']).toContain(outcome.code);
          }
        }
      }),
    );
    expect(counts.escapes).toEqual([]);
    await outsideUntouched(outside);
    // Every write that succeeded is inside the workspace (in whichever directory the swap left it).
    child.kill('SIGKILL');
    await new Promise((resolve) => child.once('exit', resolve));
    const files = new Map(
      [...(await scan(workspace))].map(([rel, entry]) => [path.basename(rel), entry.content] as const),
    );
    for (const name of written) expect({ name, content: files.get(name) }).toEqual({ name, content: name });
    expect(counts.reads).toBeGreaterThanOrEqual(3000);
    expect(counts.writes).toBeGreaterThanOrEqual(1000);
    // The race was real: some requests got through and some were refused.
    expect(counts.readOk).toBeGreaterThan(0);
    expect(counts.readOk).toBeLessThan(counts.reads);
  } finally {
    child.kill('SIGKILL');
  }
});

test('FIFOs, sockets and devices named like the file are refused, several at once, without blocking anything', async () => {
  const workspace = await tempDir('ws');
  await fs.writeFile(path.join(workspace, 'plain.txt'), 'plain');
  const specials: string[] = [];
  for (let i = 0; i < 6; i++) {
    execFileSync('mkfifo', [path.join(workspace, `fifo-${i}`)]);
    specials.push(`fifo-${i}`);
  }
  const server: Server = createServer();
  await new Promise<void>((resolve) => server.listen(path.join(workspace, 'sock'), resolve));
  specials.push('sock');
  // A device node needs CAP_MKNOD: made when the tests run as root (as in CI here).
  if (process.getuid?.() === 0) {
    execFileSync('mknod', [path.join(workspace, 'null'), 'c', '1', '3']);
    execFileSync('mknod', [path.join(workspace, 'zero'), 'c', '1', '5']);
    specials.push('null', 'zero');
  }
  // Should an open ever block (the bug this guards against), free the threads so the test fails instead of hanging.
  const watchdog = setInterval(() => {
    blocked = true;
    spawn('sh', ['-c', 'for f in fifo-*; do : <>"$f"; done'], { cwd: workspace, stdio: 'ignore' });
  }, 20_000);
  let blocked = false;
  try {
    // Far more than libuv's 4 threads: if any of these blocked a thread, the plain read below could not finish.
    const attempts = specials.flatMap((name) => [
      readWorkspaceFile(workspace, name),
      readWorkspaceFile(workspace, `/workspace/${name}`),
      writeWorkspaceFile(workspace, name, Buffer.from('x')),
    ]);
    const settled = Promise.allSettled(attempts);
    expect((await readWorkspaceFile(workspace, 'plain.txt')).toString()).toBe('plain');
    for (const result of await settled) {
      expect(result).toMatchObject({
        status: 'rejected',
        reason: { code: 'INVALID_ARGUMENT', message: expect.stringMatching(/not a regular file/) },
      });
    }
    // Nothing was replaced: each special file is still what it was.
    for (const name of specials) expect((await fs.lstat(path.join(workspace, name))).isFile()).toBe(false);
    expect({ blocked }).toEqual({ blocked: false });
  } finally {
    clearInterval(watchdog);
    server.close();
  }
});
