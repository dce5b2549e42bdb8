import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import fc from 'fast-check';
import { StasisError } from '../../common/errors';
import { unpackCheckpoint } from '../../stores/archive';
import { wireArchive, type WireEntry } from '../helpers/tar-wire';
import { manifest, tempDir } from '../providers/helpers';

// Property tests of restore against archives written directly in the tar wire
// format. Whatever an archive says: nothing is written outside the target, no
// symlink is followed, a refusal is CHECKPOINT_INVALID with an empty target, and
// an accepted archive comes back exactly as it was packed (symlinks verbatim,
// setuid/setgid stripped). A well-formed workspace (a venv with absolute,
// relative and dangling links) is always accepted.

const RUNS = Number(process.env.STASIS_ARCHIVE_RUNS ?? 100);
const TOPS = ['workspace', 'home', 'envs'];
/** Replaced by the absolute path of a directory beside the target, which must stay untouched. */
const OUT = '@OUT';

interface Stage {
  base: string;
  target: string;
  outside: string;
  archive: string;
}

async function stage(): Promise<Stage> {
  const base = await tempDir('hostile-prop');
  const stage = {
    base,
    target: path.join(base, 'target'),
    outside: path.join(base, 'outside'),
    archive: path.join(base, 'a.tar.gz'),
  };
  await fs.mkdir(stage.target);
  await fs.mkdir(path.join(stage.outside, 'd'), { recursive: true });
  await fs.writeFile(path.join(stage.outside, 'f'), 'outside file', { mode: 0o644 });
  await fs.writeFile(path.join(stage.outside, 'd', 'g'), 'outside, one level down', { mode: 0o600 });
  const then = new Date('2021-01-01T00:00:00Z');
  for (const p of ['f', 'd/g', 'd', '.']) await fs.utimes(path.join(stage.outside, p), then, then);
  return stage;
}

const resolveOut = (text: string, s: Stage) => text.split(OUT).join(s.outside);

type Outcome = { ok: true } | { ok: false; error: unknown };

/** As tar reads it: an old-style file entry whose path ends in `/` is a directory. */
const effectiveType = (e: WireEntry): string => (e.type === '0' && e.path.endsWith('/') ? '5' : e.type);

async function unpack(entries: WireEntry[], s: Stage): Promise<Outcome> {
  const concrete = entries.map((e) => ({
    ...e,
    path: resolveOut(e.path, s),
    ...(e.linkpath !== undefined ? { linkpath: resolveOut(e.linkpath, s) } : {}),
  }));
  await fs.writeFile(s.archive, wireArchive(concrete));
  return unpackCheckpoint(s.archive, s.target, { maxBytes: 1024 * 1024, maxEntries: 1000 }).then(
    () => ({ ok: true }),
    (error: unknown) => ({ ok: false, error }),
  );
}

/** `workspace/a/b` as restore must see a raw path, or undefined when the path itself escapes or is empty. */
function normalise(raw: string): string | undefined {
  if (raw.startsWith('/')) return undefined;
  const parts = raw.split('/');
  if (parts.includes('..')) return undefined;
  const kept = parts.filter((p) => p !== '' && p !== '.');
  return kept.length > 0 ? kept.join('/') : undefined;
}

const ancestors = (p: string): string[] => {
  const parts = p.split('/');
  return parts.slice(1).map((_, i) => parts.slice(0, i + 1).join('/'));
};

/** Reasons the rules leave no choice but to refuse the archive (a subset of all reasons). */
function mustRefuse(entries: WireEntry[]): string | undefined {
  const seen = new Set<string>();
  const symlinks = new Set<string>();
  for (const e of entries) {
    const p = normalise(e.path);
    if (p === undefined) return `path ${e.path} escapes`;
    const type = effectiveType(e);
    if (['3', '4', '6'].includes(type)) return `${p} is a device or FIFO`;
    if (seen.has(p)) return `${p} twice`;
    seen.add(p);
    if (type === '2') symlinks.add(p);
    if (type === '1' && normalise(e.linkpath ?? '') === undefined) return `${p} hardlinks outside`;
  }
  for (const p of seen) {
    const through = ancestors(p).find((a) => symlinks.has(a));
    if (through) return `${p} lies through the symlink ${through}`;
  }
  return undefined;
}

interface Found {
  kind: 'file' | 'dir' | 'link' | 'other';
  mode: number;
  ino: number;
  content?: string;
  target?: string;
}

async function walk(root: string): Promise<Map<string, Found>> {
  const found = new Map<string, Found>();
  async function visit(dir: string, rel: string): Promise<void> {
    for (const name of await fs.readdir(dir)) {
      const full = path.join(dir, name);
      const relPath = rel ? `${rel}/${name}` : name;
      const stat = await fs.lstat(full);
      const base = { mode: stat.mode & 0o7777, ino: stat.ino };
      if (stat.isSymbolicLink()) found.set(relPath, { kind: 'link', ...base, target: await fs.readlink(full) });
      else if (stat.isDirectory()) {
        found.set(relPath, { kind: 'dir', ...base });
        await visit(full, relPath);
      } else if (stat.isFile()) found.set(relPath, { kind: 'file', ...base, content: await fs.readFile(full, 'utf8') });
      else found.set(relPath, { kind: 'other', ...base });
    }
  }
  await visit(root, '');
  return found;
}

const stripped = (mode: number | undefined, fallback: number) => (mode ?? fallback) & 0o1777;

/** The target holds exactly the archive: every entry as written, and nothing else but the parents of entries. */
async function expectReproduced(entries: WireEntry[], s: Stage): Promise<void> {
  const found = await walk(s.target);
  const expected = new Set<string>();
  for (const e of entries) {
    const p = normalise(e.path)!;
    expected.add(p);
    const got = found.get(p);
    const type = effectiveType(e);
    const what = `${p} (type ${type})`;
    if (type === '5')
      expect({ what, kind: got?.kind, mode: got?.mode }).toEqual({ what, kind: 'dir', mode: stripped(e.mode, 0o755) });
    if (type === '0' || type === '7')
      expect({ what, kind: got?.kind, mode: got?.mode, content: got?.content }).toEqual({
        what,
        kind: 'file',
        mode: stripped(e.mode, 0o644),
        content: (e.data ?? Buffer.alloc(0)).toString(),
      });
    if (type === '2')
      expect({ what, kind: got?.kind, target: got?.target }).toEqual({
        what,
        kind: 'link',
        target: resolveOut(e.linkpath!, s),
      });
    if (type === '1') {
      const of = found.get(normalise(e.linkpath!)!);
      expect({ what, kind: got?.kind, ino: got?.ino }).toEqual({ what, kind: 'file', ino: of?.ino });
    }
  }
  for (const [p, got] of found) {
    if (expected.has(p)) continue;
    // Anything not in the archive may only be a directory the archive implies.
    expect({ p, kind: got.kind, implied: [...expected].some((e) => e.startsWith(`${p}/`)) }).toEqual({
      p,
      kind: 'dir',
      implied: true,
    });
  }
  for (const [p, got] of found) expect({ p, setid: got.mode & 0o6000 }).toEqual({ p, setid: 0 });
}

/** Outside the target: nothing written, changed, linked to or created. */
async function expectOutsideUntouched(s: Stage, before: string[], outsideInodes: Set<number>): Promise<void> {
  expect((await fs.readdir(s.base)).sort()).toEqual(['a.tar.gz', 'outside', 'target']);
  expect(await manifest(s.outside)).toEqual(before);
  const stat = await fs.stat(s.outside);
  expect(stat.mode & 0o7777).toBe(0o755);
  expect(stat.mtime.toISOString()).toBe('2021-01-01T00:00:00.000Z');
  for (const [p, got] of await walk(s.target)) {
    if (got.kind === 'file')
      expect({ p, outsideInode: outsideInodes.has(got.ino) }).toEqual({ p, outsideInode: false });
  }
}

async function check(entries: WireEntry[], expectation: 'any' | 'accept'): Promise<void> {
  const s = await stage();
  await fs.chmod(s.outside, 0o755);
  const before = await manifest(s.outside);
  const outsideInodes = new Set<number>();
  for (const p of ['f', 'd/g']) outsideInodes.add((await fs.stat(path.join(s.outside, p))).ino);
  const then = new Date('2021-01-01T00:00:00Z');
  await fs.utimes(s.outside, then, then);
  try {
    const outcome = await unpack(entries, s);
    await expectOutsideUntouched(s, before, outsideInodes);
    if (!outcome.ok) {
      // A hostile archive is invalid for good (never a retryable system error), and nothing was written.
      const err = outcome.error;
      expect(err instanceof StasisError ? err.code : String(err)).toBe('CHECKPOINT_INVALID');
      expect(await fs.readdir(s.target)).toEqual([]);
      if (expectation === 'accept') throw new Error(`a well-formed archive was refused: ${String(err)}`);
      return;
    }
    const reason = mustRefuse(entries.map((e) => ({ ...e, path: resolveOut(e.path, s) })));
    expect({ accepted: true, mustRefuse: reason }).toEqual({ accepted: true, mustRefuse: undefined });
    await expectReproduced(entries, s);
  } finally {
    await fs.rm(s.base, { recursive: true, force: true });
  }
}

const nameArb = fc.constantFrom('a', 'b', 'l', 'x');
const segmentArb = fc.oneof(
  { weight: 12, arbitrary: nameArb },
  { weight: 1, arbitrary: fc.constant('..') },
  { weight: 1, arbitrary: fc.constant('.') },
  { weight: 1, arbitrary: fc.constant('') },
);
const pathArb = fc.oneof(
  {
    weight: 12,
    arbitrary: fc
      .tuple(fc.constantFrom(...TOPS), fc.array(segmentArb, { maxLength: 3 }))
      .map(([top, rest]) => [top, ...rest].join('/')),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom(`${OUT}/abs`, `${OUT}/d/g`, 'etc/passwd', './workspace/a', 'workspace/../outside/x', ''),
  },
);
const linkArb = fc.constantFrom(
  OUT,
  `${OUT}/f`,
  `${OUT}/d`,
  '../../outside',
  '../../outside/f',
  '..',
  '../a',
  'a',
  'l',
  'l/x',
  '/usr/bin/python3',
  'nowhere/x',
  'workspace/a',
  'workspace/l',
  'home/a',
);
const typeArb = fc.constantFrom('0', '0', '0', '5', '5', '5', '2', '2', '2', '1', '1', '3', '4', '6', '7', 'S');
const modeArb = fc.constantFrom(0o644, 0o755, 0o4777, 0o2755, 0o6711, 0o1777, 0o600);
const entryArb: fc.Arbitrary<WireEntry> = fc
  .record({ path: pathArb, type: typeArb, linkpath: linkArb, mode: modeArb, data: fc.constantFrom('', 'x', 'hello') })
  .map(({ path: p, type, linkpath, mode, data }) => ({
    path: type === '5' ? `${p}/` : p,
    type,
    mode,
    ...(type === '1' || type === '2' ? { linkpath } : {}),
    ...(type === '0' || type === '7' ? { data: Buffer.from(data) } : {}),
  }));

/** A workspace as a packer writes it: directories before their contents, links to anywhere, hardlinks to earlier files. */
const wellFormedArb: fc.Arbitrary<WireEntry[]> = fc
  .array(
    fc.record({
      parent: fc.nat(),
      kind: fc.constantFrom('dir', 'file', 'file', 'symlink', 'symlink', 'hardlink'),
      mode: modeArb,
      link: fc.oneof(linkArb, fc.constantFrom('../../../../../..', 'python3', '.', 'bin/python')),
      pick: fc.nat(),
    }),
    { maxLength: 25 },
  )
  .map((nodes) => {
    const dirs = [...TOPS];
    const files: string[] = [];
    const entries: WireEntry[] = TOPS.map((top) => ({ path: `${top}/`, type: '5' }));
    nodes.forEach((node, i) => {
      const p = `${dirs[node.parent % dirs.length]}/n${i}`;
      if (node.kind === 'dir') {
        dirs.push(p);
        entries.push({ path: `${p}/`, type: '5', mode: node.mode });
      } else if (node.kind === 'symlink') entries.push({ path: p, type: '2', linkpath: node.link });
      else if (node.kind === 'hardlink' && files.length > 0)
        entries.push({ path: p, type: '1', linkpath: files[node.pick % files.length] });
      else {
        files.push(p);
        entries.push({ path: p, type: '0', mode: node.mode, data: Buffer.from(`content of ${p}`) });
      }
    });
    return entries;
  });

describe('restore of hostile archives (wire format)', () => {
  it('writes nothing outside the target, follows no symlink, refuses as CHECKPOINT_INVALID or reproduces exactly', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(entryArb, { minLength: 1, maxLength: 12 }), (entries) => check(entries, 'any')),
      { numRuns: RUNS },
    );
  });

  it('attacks that reach outside through links the archive itself made', async () => {
    const attacks: WireEntry[][] = [
      // A symlink, then a file, a directory, a hardlink and a symlink written through it.
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: OUT },
        { path: 'workspace/l/pwned', type: '0', data: Buffer.from('x') },
      ],
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: '../../outside' },
        { path: 'workspace/l/d/', type: '5', mode: 0o777 },
      ],
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: OUT },
        { path: 'workspace/l/f', type: '1', linkpath: 'workspace/l/d/g' },
      ],
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: OUT },
        { path: 'workspace/l/s', type: '2', linkpath: '/etc' },
      ],
      // A hardlink to a symlink that points outside: linking must not follow it.
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: `${OUT}/f` },
        { path: 'workspace/h', type: '1', linkpath: 'workspace/l' },
      ],
      // A directory entry whose path is a symlink made earlier: its mode must not land on the link's target.
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: `${OUT}/d` },
        { path: 'workspace/l/', type: '5', mode: 0o777 },
      ],
      // The symlink comes after the entry beneath it.
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l/x', type: '0', data: Buffer.from('x') },
        { path: 'workspace/l', type: '2', linkpath: OUT },
      ],
      // A file written onto a symlink of the same name.
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: `${OUT}/f` },
        { path: 'workspace/l', type: '0', data: Buffer.from('x') },
      ],
      // A long path through a link, carried in a pax header.
      [
        { path: 'workspace/', type: '5' },
        { path: 'workspace/l', type: '2', linkpath: OUT },
        { path: `workspace/l/${'y'.repeat(150)}`, type: '0', data: Buffer.from('x') },
      ],
    ];
    for (const entries of attacks) await check(entries, 'any');
  });

  it('always accepts a well-formed workspace and reproduces it: links verbatim, setuid and setgid stripped', async () => {
    await fc.assert(
      fc.asyncProperty(wellFormedArb, (entries) => check(entries, 'accept')),
      { numRuns: RUNS },
    );
  });

  it('restores a venv: absolute, relative and dangling symlinks verbatim; a 4777 file comes back 0777', async () => {
    const venv: WireEntry[] = [
      { path: 'workspace/', type: '5' },
      { path: 'home/', type: '5' },
      { path: 'envs/', type: '5' },
      { path: 'envs/venv/', type: '5' },
      { path: 'envs/venv/bin/', type: '5' },
      { path: 'envs/venv/bin/python3', type: '2', linkpath: '/usr/bin/python3' },
      { path: 'envs/venv/bin/python', type: '2', linkpath: 'python3' },
      { path: 'envs/venv/bin/python3.12', type: '2', linkpath: 'python3' },
      { path: 'envs/venv/lib/', type: '5' },
      { path: 'envs/venv/lib64', type: '2', linkpath: 'lib' },
      { path: 'envs/venv/dangling', type: '2', linkpath: '/nonexistent/stasis/nothing' },
      { path: 'envs/venv/up', type: '2', linkpath: '../../../..' },
      { path: 'workspace/suid', type: '0', mode: 0o4777, data: Buffer.from('#!/bin/sh\n') },
      { path: 'workspace/sgid-dir/', type: '5', mode: 0o2775 },
    ];
    await check(venv, 'accept');
  });
});
