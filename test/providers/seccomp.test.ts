import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync, readlinkSync } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { createBwrapProvider } from '../../providers/bwrap';
import { runExternalJob } from '../../providers/external-jobs';
import { scanSandboxProcesses } from '../../providers/processes';
import { sandboxSeccompProgram } from '../../providers/seccomp';
import { context, tempDir, uniqueId } from './helpers';
import { makeHost, sh, type Host } from './harness';

// The bwrap provider's seccomp filter (providers/seccomp.ts), attacked with real syscalls from inside
// real sandboxes. A sandbox runs as the worker's uid (root here): without the filter each attack below
// left a setuid/setgid-root file in an active workspace (a plain host directory), or reached the
// keyrings of the worker's uid. Needs bubblewrap and python3 on the test machine; x86-64 for the
// i386 and x32 attacks.

const bwrapHost = () => makeHost({ make: (deps) => createBwrapProvider(deps) });

/** Every file under `root` (as the host sees it) whose mode has S_ISUID or S_ISGID. */
async function setIdFiles(root: string): Promise<string[]> {
  const found: string[] = [];
  const walk = async (dir: string) => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      const file = path.join(dir, entry.name);
      const stat = await fs.lstat(file);
      if (stat.mode & 0o6000) found.push(`${path.relative(root, file)} ${(stat.mode & 0o7777).toString(8)}`);
      if (entry.isDirectory()) await walk(file);
    }
  };
  await walk(root);
  return found;
}

/**
 * Each way a process can ask the kernel for a setuid/setgid file, and the refused syscalls, made with
 * python3's os module and raw syscall numbers (x86-64). Prints {attack: "ok" | errno name}. Run as
 * root on the host, unfiltered, every one of them succeeds (each file is made setuid/setgid), except
 * the x32 ones on a kernel built without x32 (ENOSYS either way), and io_uring_enter/register (given
 * no ring).
 */
const ATTACKS = String.raw`
import ctypes, errno, json, os, stat, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
def name(e): return errno.errorcode.get(e, str(e))
def py(what, fn):
    try:
        r = fn()
        if isinstance(r, int) and r > 2: os.close(r)
        out[what] = 'ok'
    except OSError as e:
        out[what] = name(e.errno)
def raw(what, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    out[what] = 'ok' if r >= 0 else name(ctypes.get_errno())
    if r > 2 and what.startswith(('open', 'creat')): os.close(r)
AT_FDCWD = -100
HIGH = 1 << 32  # junk above the 32 bits a mode or flags argument is read from
for mode, tag in ((0o4755, 'suid'), (0o2755, 'sgid')):
    t = 'target-' + tag
    open(t, 'w').close()
    py(tag + ' os.chmod', lambda: os.chmod(t, mode))
    dfd = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
    py(tag + ' os.chmod dir_fd (fchmodat)', lambda: os.chmod(t, mode, dir_fd=dfd))
    fd = os.open(t, os.O_RDONLY)
    py(tag + ' os.fchmod', lambda: os.fchmod(fd, mode))
    py(tag + ' os.open O_CREAT', lambda: os.open('open-' + tag, os.O_CREAT | os.O_WRONLY, mode))
    py(tag + ' os.open O_TMPFILE', lambda: os.open('.', os.O_TMPFILE | os.O_WRONLY, mode))
    py(tag + ' os.mknod S_IFREG', lambda: os.mknod('mknod-' + tag, stat.S_IFREG | mode))
    py(tag + ' os.mknod dir_fd (mknodat)', lambda: os.mknod('mknodat-' + tag, stat.S_IFREG | mode, dir_fd=dfd))
    p = t.encode()
    raw(tag + ' chmod', 90, p, mode)
    raw(tag + ' chmod high bits', 90, p, mode | HIGH)
    raw(tag + ' fchmod', 91, fd, mode)
    raw(tag + ' fchmodat', 268, AT_FDCWD, p, mode)
    raw(tag + ' fchmodat2', 452, AT_FDCWD, p, mode, 0)
    raw(tag + ' fchmodat2 nofollow', 452, AT_FDCWD, p, mode, 0x100)
    raw(tag + ' creat', 85, b'creat-' + tag.encode(), mode)
    raw(tag + ' creat high bits', 85, b'creat-hi-' + tag.encode(), mode | HIGH)
    raw(tag + ' open', 2, b'rawopen-' + tag.encode(), os.O_CREAT | os.O_WRONLY, mode)
    raw(tag + ' openat', 257, AT_FDCWD, b'rawopenat-' + tag.encode(), os.O_CREAT | os.O_WRONLY | HIGH, mode | HIGH)
    raw(tag + ' openat O_TMPFILE', 257, AT_FDCWD, b'.', os.O_TMPFILE | os.O_WRONLY, mode)
    raw(tag + ' mknod', 133, b'rawmknod-' + tag.encode(), stat.S_IFREG | mode, 0)
    raw(tag + ' mknodat', 259, AT_FDCWD, b'rawmknodat-' + tag.encode(), stat.S_IFREG | mode, 0)
    raw(tag + ' x32 chmod', 0x40000000 | 90, p, mode)
    raw(tag + ' x32 fchmodat', 0x40000000 | 268, AT_FDCWD, p, mode)
    os.close(fd)
    os.close(dfd)
how = struct.pack('QQQ', os.O_CREAT | os.O_WRONLY, 0o4755, 0)
raw('openat2', 437, AT_FDCWD, b'openat2-suid', how, len(how))
raw('io_uring_setup', 425, 8, ctypes.create_string_buffer(120))
raw('io_uring_enter', 426, 0, 0, 0, 0, None, 0)
raw('io_uring_register', 427, 0, 0, None, 0)
raw('add_key', 248, b'user', b'stasis-probe', b'x', 1, -4)
raw('keyctl', 250, 0, -3, 0)
raw('request_key', 249, b'user', b'stasis-probe', None, -4)
# The i386 ABI from this 64-bit process: int 0x80 with i386 numbers (chmod is 15), from code and a
# path mapped below 4 GiB.
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
mem = libc.mmap(None, 4096, 7, 0x22 | 0x40, -1, 0)  # rwx, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT
def int80(nr, ebx, ecx):
    code = b'\x53\xb8' + struct.pack('<I', nr) + b'\xbb' + struct.pack('<I', ebx) + b'\xb9' + struct.pack('<I', ecx) + b'\xcd\x80\x5b\xc3'
    ctypes.memmove(mem, code, len(code))
    r = ctypes.CFUNCTYPE(ctypes.c_int)(mem)()
    return 'ok' if r >= 0 else name(-r)
ctypes.memmove(mem + 2048, b'target-suid\0', 12)
out['i386 chmod'] = int80(15, mem + 2048, 0o4755)
out['i386 getpid'] = int80(20, 0, 0)
print(json.dumps(out))
`;

/** Ordinary work that sets modes and creates files: none of it may be refused. */
const ORDINARY = String.raw`
set -e
umask 022
mkdir -p d/e && mkdir -m 700 private && chmod 755 d && chmod 1777 d/e
touch f && chmod 600 f && chmod u+x,g+r f && chmod 644 f
install -m 755 /usr/bin/id ./id2 && cp -p id2 id3 && cp -a d d2 && mkfifo fifo
python3 - <<'PY'
import os, stat
fd = os.open('created', os.O_CREAT | os.O_WRONLY, 0o644); os.fchmod(fd, 0o755); os.close(fd)
os.mknod('node', stat.S_IFREG | 0o640)
fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o600); os.close(fd)
os.chmod('f', 0o1777)
PY
tar cf a.tar d f id2 && mkdir x && tar xpf a.tar -C x
git init -q repo && cd repo && git config user.email a@b.c && git config user.name a
echo hi > run.sh && chmod +x run.sh && git add run.sh && git commit -qm first && git update-index --chmod=-x run.sh
git commit -qm second && git checkout -q HEAD~1 -- run.sh && git gc -q
cd .. && stat -c '%n %a' d d/e private f id2 id3 created node x/id2 repo/run.sh
`;

describe('bwrap sandboxes run under a seccomp filter', () => {
  let host: Host;
  let project: string;
  let id: string;

  beforeAll(async () => {
    host = await bwrapHost();
    project = await tempDir('project');
    await fs.chmod(project, 0o755); // an ordinary project directory on the host, readable by its users
    id = await host.sandbox({ hostPath: project });
  });

  afterAll(async () => {
    await host.provider.destroy({ sandboxId: id, fence: 1 }, context()).catch(() => undefined);
    await fs.rm(project, { recursive: true, force: true });
  });

  it('refuses every way to make a setuid or setgid file in an active workspace, and the host has none', async () => {
    const shell = await host.provider.exec(
      {
        sandboxId: id,
        fence: 1,
        jobId: uniqueId('job'),
        command: [
          'cp /usr/bin/id ./id; chmod 4755 ./id && echo "chmod 4755 succeeded"',
          'chmod g+s ./id && echo "chmod g+s succeeded"',
          'chmod u+s ./id && echo "chmod u+s succeeded"',
          'install -m 4755 /usr/bin/id ./installed && echo "install -m 4755 succeeded"',
          'cp -p /usr/bin/passwd ./passwd-copy; cp -a /usr/bin/passwd ./passwd-copy2',
          'mkdir -p from && tar cf s.tar --mode=6755 id && tar xpf s.tar -C from && echo "tar xp succeeded"',
          'mkdir -m 2775 shared; mkdir -m 4775 shared2',
          'echo done',
        ].join('\n'),
      },
      context(),
    );
    expect(shell.stdout).toBe('done\n');
    expect(shell.stderr).toMatch(/chmod: changing permissions of '.\/id': Operation not permitted/);
    const raw = JSON.parse(await sh(host.provider, id, `python3 - <<'PY'\n${ATTACKS}\nPY`)) as Record<string, string>;
    const expected: Record<string, string> = {};
    for (const name of Object.keys(raw)) expected[name] = 'EPERM';
    for (const name of [
      'openat2',
      'io_uring_setup',
      'io_uring_enter',
      'io_uring_register',
      'i386 chmod',
      'i386 getpid',
    ])
      expected[name] = 'ENOSYS';
    for (const name of Object.keys(raw).filter((n) => n.includes(' x32 '))) expected[name] = 'ENOSYS';
    expect(raw).toEqual(expected);
    expect(Object.keys(raw)).toHaveLength(2 * 22 + 9);

    expect(await setIdFiles(project)).toEqual([]);
    // The program it copied runs, for any host user, as that user.
    const euid = execFileSync('setpriv', [
      '--reuid=65534',
      '--regid=65534',
      '--clear-groups',
      path.join(project, 'id'),
      '-u',
    ]);
    expect(euid.toString().trim()).toBe('65534');
  }, 60_000);

  it('still lets ordinary work set modes and create files (chmod, install, cp -p, tar, git)', async () => {
    const out = await sh(host.provider, id, `mkdir ordinary && cd ordinary\n${ORDINARY}`);
    expect(out.trim().split('\n')).toEqual([
      'd 755',
      'd/e 1777',
      'private 700',
      'f 1777',
      'id2 755',
      'id3 755',
      'created 755',
      'node 640',
      'x/id2 755',
      'repo/run.sh 755',
    ]);
    expect(await setIdFiles(project)).toEqual([]);
  }, 60_000);

  it('covers every process: bwrap’s init in the sandbox too, and the program never stays open in the sandbox', async () => {
    const out = await sh(
      host.provider,
      id,
      'grep -h "^Seccomp:" /proc/1/status /proc/self/status; ' +
        'python3 -c "import os; print(sorted(int(f) for f in os.listdir(\'/proc/self/fd\')))"',
    );
    // 0-2 are stdio; 3 is the directory listdir had open.
    expect(out).toBe('Seccomp:\t2\nSeccomp:\t2\n[0, 1, 2, 3]\n');
    // On the host: the sandbox's long-lived init (sleep, started in the background) is filtered too;
    // only bubblewrap's outer process, which runs bwrap's code alone, is not.
    const seen = ((await scanSandboxProcesses(host.hostId)).get(id) ?? []).map(({ pid }) => {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      return `${path.basename(readlinkSync(`/proc/${pid}/exe`))} ${/^Seccomp:\s*(\d)/m.exec(status)?.[1]}`;
    });
    expect(seen).toContain('sleep 2');
    expect(seen.filter((p) => !p.startsWith('bwrap ')).every((p) => p.endsWith(' 2'))).toBe(true);
  });

  it('keeps the keyrings of the worker’s uid out of reach: its own keys, a neighbour’s, the user-session keyring', async () => {
    const KEYS = String.raw`
import ctypes, sys
l = ctypes.CDLL(None, use_errno=True)
l.syscall.restype = ctypes.c_long
op, desc = sys.argv[1], sys.argv[2].encode()
ring = {'user': -4, 'session': -5}[sys.argv[3]]
if op == 'add':
    payload = sys.argv[4].encode()
    r = l.syscall(248, b'user', desc, payload, len(payload), ring)
    print(r if r > 0 else 'refused %d' % ctypes.get_errno())
elif op == 'steal':
    k = l.syscall(250, 10, ring, b'user', desc, 0)
    if k < 0: print('not found %d' % ctypes.get_errno()); sys.exit(0)
    buf = ctypes.create_string_buffer(4096)
    n = l.syscall(250, 11, k, buf, 4096)
    print(buf.raw[:max(n, 0)].decode(), 'invalidate', l.syscall(250, 21, k))
elif op == 'has':
    print('present' if l.syscall(250, 10, ring, b'user', desc, 0) > 0 else 'gone')
elif op == 'drop':
    k = l.syscall(250, 10, ring, b'user', desc, 0)
    if k > 0: l.syscall(250, 21, k)
`;
    const tag = randomBytes(6).toString('hex');
    const onHost = (...args: string[]) =>
      execFileSync('python3', ['-c', KEYS, ...args])
        .toString()
        .trim();
    const inSandbox = (sandboxId: string, args: string) =>
      sh(host.provider, sandboxId, `python3 - ${args} <<'PY'\n${KEYS}\nPY`).then((s) => s.trim());
    // The worker's uid keeps secrets in its user and its user-session keyring, as any root process may.
    onHost('add', `stasis-worker-${tag}`, 'user', 'worker-secret');
    onHost('add', `stasis-session-${tag}`, 'session', 'session-secret');
    const neighbour = await host.sandbox();
    try {
      expect(await inSandbox(neighbour, `add stasis-neighbour-${tag} user from-the-neighbour`)).toBe('refused 1');
      expect(await inSandbox(id, `steal stasis-worker-${tag} user`)).toBe('not found 1');
      expect(await inSandbox(id, `steal stasis-session-${tag} session`)).toBe('not found 1');
      expect(onHost('has', `stasis-session-${tag}`, 'session')).toBe('present');
      expect(onHost('has', `stasis-neighbour-${tag}`, 'user')).toBe('gone');
    } finally {
      onHost('drop', `stasis-worker-${tag}`, 'user');
      onHost('drop', `stasis-session-${tag}`, 'session');
      onHost('drop', `stasis-neighbour-${tag}`, 'user');
      await host.provider.destroy({ sandboxId: neighbour, fence: 1 }, context()).catch(() => undefined);
    }
  }, 60_000);
});

it('an EXTERNAL job (bubblewrap with the host’s network) runs under the same filter', async () => {
  const dataDir = await tempDir('ext-seccomp');
  try {
    const outcome = await runExternalJob(
      { hostId: uniqueId('host-ext'), dataDir },
      {
        command:
          'cp /usr/bin/id ./id; chmod 4755 ./id || echo refused; ' +
          'python3 -c "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall(250, 0, -3, 0), ctypes.get_errno())"; ' +
          'grep "^Seccomp:" /proc/self/status',
      },
    );
    expect(outcome.stdout).toBe('refused\n-1 1\nSeccomp:\t2\n');
  } finally {
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}, 60_000);

/**
 * What `program` returns for one syscall: a classic-BPF interpreter for the few instructions the
 * generator emits (load word, jeq/jge/jset, return). Only for aarch64, which this machine cannot run.
 */
function verdict(program: Buffer, arch: number, nr: number, args: number[] = []): string {
  const data = Buffer.alloc(64);
  data.writeInt32LE(nr, 0);
  data.writeUInt32LE(arch, 4);
  args.forEach((arg, i) => data.writeUInt32LE(arg >>> 0, 16 + 8 * i));
  let acc = 0;
  for (let pc = 0; pc < program.length / 8; pc += 1) {
    const code = program.readUInt16LE(pc * 8);
    const [jt, jf, k] = [
      program.readUInt8(pc * 8 + 2),
      program.readUInt8(pc * 8 + 3),
      program.readUInt32LE(pc * 8 + 4),
    ];
    if (code === 0x20) acc = data.readUInt32LE(k);
    else if (code === 0x06)
      return k === 0x7fff0000 ? 'ALLOW' : k === 0x50001 ? 'EPERM' : k === 0x50026 ? 'ENOSYS' : k.toString(16);
    else if (code === 0x15) pc += acc === k ? jt : jf;
    else if (code === 0x35) pc += acc >= k ? jt : jf;
    else if (code === 0x45) pc += (acc & k) !== 0 ? jt : jf;
    else throw new Error(`unexpected instruction ${code.toString(16)}`);
  }
  throw new Error('ran off the end');
}

it('has a filter for aarch64 with its own numbers (include/uapi/asm-generic/unistd.h)', () => {
  const arm64 = sandboxSeccompProgram('arm64');
  const AARCH64 = 0xc00000b7;
  const AT_FDCWD = -100;
  expect({
    'fchmodat 4755': verdict(arm64, AARCH64, 53, [AT_FDCWD, 0, 0o4755]),
    'fchmodat 2755': verdict(arm64, AARCH64, 53, [AT_FDCWD, 0, 0o2755]),
    'fchmodat 755': verdict(arm64, AARCH64, 53, [AT_FDCWD, 0, 0o755]),
    'fchmod 4755': verdict(arm64, AARCH64, 52, [3, 0o4755]),
    'fchmodat2 4755': verdict(arm64, AARCH64, 452, [AT_FDCWD, 0, 0o4755, 0]),
    'openat O_CREAT 4755': verdict(arm64, AARCH64, 56, [AT_FDCWD, 0, 0o101, 0o4755]),
    'openat O_TMPFILE 2755': verdict(arm64, AARCH64, 56, [AT_FDCWD, 0, 0o20040001, 0o2755]),
    'openat O_CREAT 644': verdict(arm64, AARCH64, 56, [AT_FDCWD, 0, 0o101, 0o644]),
    'openat read, junk mode': verdict(arm64, AARCH64, 56, [AT_FDCWD, 0, 0, 0o4755]),
    'mknodat 4755': verdict(arm64, AARCH64, 33, [AT_FDCWD, 0, 0o104755, 0]),
    openat2: verdict(arm64, AARCH64, 437),
    io_uring_setup: verdict(arm64, AARCH64, 425),
    add_key: verdict(arm64, AARCH64, 217),
    request_key: verdict(arm64, AARCH64, 218),
    keyctl: verdict(arm64, AARCH64, 219),
    'mkdirat 2755': verdict(arm64, AARCH64, 34, [AT_FDCWD, 0, 0o2755]),
    'x86-64 chmod 90 (not an aarch64 rule)': verdict(arm64, AARCH64, 90, [0, 0o4755]),
    '32-bit ARM getpid': verdict(arm64, 0x40000028, 20),
  }).toEqual({
    'fchmodat 4755': 'EPERM',
    'fchmodat 2755': 'EPERM',
    'fchmodat 755': 'ALLOW',
    'fchmod 4755': 'EPERM',
    'fchmodat2 4755': 'EPERM',
    'openat O_CREAT 4755': 'EPERM',
    'openat O_TMPFILE 2755': 'EPERM',
    'openat O_CREAT 644': 'ALLOW',
    'openat read, junk mode': 'ALLOW',
    'mknodat 4755': 'EPERM',
    openat2: 'ENOSYS',
    io_uring_setup: 'ENOSYS',
    add_key: 'EPERM',
    request_key: 'EPERM',
    keyctl: 'EPERM',
    'mkdirat 2755': 'ALLOW',
    'x86-64 chmod 90 (not an aarch64 rule)': 'ALLOW',
    '32-bit ARM getpid': 'ENOSYS',
  });
});

it('the interpreter above agrees with the kernel on the x86-64 filter', () => {
  const x64 = sandboxSeccompProgram('x64');
  const X86_64 = 0xc000003e;
  expect([
    verdict(x64, X86_64, 90, [0, 0o4755]), // chmod
    verdict(x64, X86_64, 90, [0, 0o755]),
    verdict(x64, X86_64, 257, [-100, 0, 0o101, 0o4755]), // openat
    verdict(x64, X86_64, 39), // getpid
    verdict(x64, X86_64, 0x40000000 | 39), // x32
    verdict(x64, 0x40000003, 20), // i386 getpid
    verdict(x64, X86_64, 250), // keyctl
  ]).toEqual(['EPERM', 'ALLOW', 'EPERM', 'ALLOW', 'ENOSYS', 'ENOSYS', 'EPERM']);
});

it('has no filter for another architecture: there bwrap sandboxes do not start unfiltered', () => {
  expect(() => sandboxSeccompProgram('riscv64')).toThrow(expect.objectContaining({ code: 'NOT_SUPPORTED' }));
  expect(() => sandboxSeccompProgram('ia32')).toThrow(expect.objectContaining({ code: 'NOT_SUPPORTED' }));
});
