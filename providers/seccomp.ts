import { StasisError } from '../common/errors';

/**
 * The seccomp filter bubblewrap installs (`bwrap --seccomp FD`) for every process of a bwrap sandbox.
 *
 * A bwrap sandbox runs as the worker's uid (root on a root worker) with no capability, but with no user
 * namespace of its own either: what the kernel grants to the uid itself, with no capability, the sandbox
 * still has. The filter takes away the two such grants that reach beyond the sandbox:
 *
 * - Setting S_ISUID or S_ISGID on a file. An active workspace is a plain host directory, so a root
 *   sandbox's `cp /usr/bin/id ./id; chmod 4755 ./id` left a setuid-root program there that any host
 *   user could run for euid 0 (a file's owner needs no capability to set S_ISUID, nor S_ISGID for a
 *   group it is in). Every call that sets a mode is refused (EPERM) when its mode has either bit:
 *   chmod, fchmod, fchmodat, fchmodat2; open, openat and creat when they create a file (O_CREAT, or
 *   O_TMPFILE, which takes a mode too); mknod and mknodat (which make regular files as well).
 *   mkdir and mkdirat are left alone: the kernel keeps only the permission and sticky bits of their
 *   mode (vfs_mkdir masks it with S_IRWXUGO | S_ISVTX), and a directory is setgid only by inheriting
 *   it from a setgid parent, which the sandbox cannot make. `chmod g+s dir` is refused like any other
 *   (the filter cannot tell a directory from a file): group-shared directories buy nothing in a
 *   sandbox whose processes all run as one uid.
 *   openat2 takes its mode in a struct in memory, which a filter cannot read: refused with ENOSYS,
 *   so that libc and programs fall back to openat. io_uring submits opens and other file operations
 *   that are no syscall of their own, so the filter would never see them: io_uring_setup,
 *   io_uring_enter and io_uring_register are refused with ENOSYS (programs fall back to plain
 *   syscalls, as they do on kernels without io_uring; Docker's default profile refuses them too).
 *   Modes are compared on the low 32 bits of the 64-bit argument: the kernel reads a mode_t (and the
 *   flags an int) from it; both architectures here are little-endian.
 * - The kernel's keyrings. Keys belong to uids: the sandbox could read a key the worker's uid keeps
 *   in its user keyring, one a neighbour sandbox stored, and invalidate keys in the user-session
 *   keyring; masking /proc/keys does not cover the syscalls. add_key, keyctl and request_key are
 *   refused with EPERM (as in Docker's default profile).
 *
 * A filter matches syscall numbers, which differ between ABIs: a syscall of an ABI the tables do not
 * cover would pass every rule unchecked. So the architecture is checked first, and any syscall not of
 * the native ABI fails with ENOSYS: on x86-64, the i386 ABI (int 0x80, or a 32-bit program) and the
 * x32 ABI (native arch, with bit 0x40000000 in the number); on aarch64, 32-bit ARM. 32-bit programs
 * therefore do not run in a bwrap sandbox. Hosts of another architecture have no table: there the
 * bwrap provider refuses to start sandboxes (NOT_SUPPORTED) rather than run them unfiltered.
 *
 * Everything else is allowed. What remains shared because sandboxes run as the worker's uid is in the
 * README ("Sandbox processes and limits").
 */

/** The syscall numbers the filter needs, per architecture. */
interface SyscallTable {
  /** AUDIT_ARCH_* of the native ABI (include/uapi/linux/audit.h). */
  auditArch: number;
  /** Numbers with this bit set are another ABI (x32 on x86-64). */
  foreignBit?: number;
  nr: {
    /** Absent on architectures that only have the *at form. */
    open?: number;
    creat?: number;
    chmod?: number;
    mknod?: number;
    openat: number;
    openat2: number;
    fchmod: number;
    fchmodat: number;
    fchmodat2: number;
    mknodat: number;
    io_uring_setup: number;
    io_uring_enter: number;
    io_uring_register: number;
    add_key: number;
    request_key: number;
    keyctl: number;
  };
}

/**
 * x86-64: linux/arch/x86/entry/syscalls/syscall_64.tbl (checked against this host's
 * /usr/include/x86_64-linux-gnu/asm/unistd_64.h; fchmodat2, added in Linux 6.6, is 452 on every architecture).
 */
const X86_64: SyscallTable = {
  auditArch: 0xc000003e, // AUDIT_ARCH_X86_64
  foreignBit: 0x40000000, // __X32_SYSCALL_BIT
  nr: {
    open: 2,
    creat: 85,
    chmod: 90,
    fchmod: 91,
    mknod: 133,
    add_key: 248,
    request_key: 249,
    keyctl: 250,
    openat: 257,
    mknodat: 259,
    fchmodat: 268,
    io_uring_setup: 425,
    io_uring_enter: 426,
    io_uring_register: 427,
    openat2: 437,
    fchmodat2: 452,
  },
};

/** aarch64: include/uapi/asm-generic/unistd.h (no open, creat, chmod or mknod: only the *at forms). */
const AARCH64: SyscallTable = {
  auditArch: 0xc00000b7, // AUDIT_ARCH_AARCH64
  nr: {
    mknodat: 33,
    fchmod: 52,
    fchmodat: 53,
    openat: 56,
    add_key: 217,
    request_key: 218,
    keyctl: 219,
    io_uring_setup: 425,
    io_uring_enter: 426,
    io_uring_register: 427,
    openat2: 437,
    fchmodat2: 452,
  },
};

const TABLES: Partial<Record<NodeJS.Architecture, SyscallTable>> = { x64: X86_64, arm64: AARCH64 };

const S_ISUID = 0o4000;
const S_ISGID = 0o2000;
/** The flags with which open/openat use their mode: O_CREAT, and __O_TMPFILE (the same on x86-64 and aarch64). */
const O_CREAT = 0o100;
const O_TMPFILE_BIT = 0o20000000;
const EPERM = 1;
const ENOSYS = 38;

// Classic BPF (linux/filter.h, linux/bpf_common.h) and seccomp (linux/seccomp.h).
const BPF_LD_W_ABS = 0x20;
const BPF_JEQ_K = 0x15;
const BPF_JGE_K = 0x35;
const BPF_JSET_K = 0x45;
const BPF_RET_K = 0x06;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const SECCOMP_RET_ERRNO = 0x00050000;
/** struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]. */
const NR_OFFSET = 0;
const ARCH_OFFSET = 4;
/** The low 32 bits of args[i] (little-endian). */
const argLow = (i: number) => 16 + 8 * i;

/** A rule for one syscall, checked once its number matched. */
type Rule =
  | { kind: 'refuse'; errno: number }
  /** Refused with EPERM when args[mode] has S_ISUID or S_ISGID (and, with `flags`, when args[flags] makes it create). */
  | { kind: 'mode'; mode: number; flags?: number };

function rules(table: SyscallTable): [nr: number, rule: Rule][] {
  const { nr } = table;
  const refuse = (errno: number): Rule => ({ kind: 'refuse', errno });
  const list: [number | undefined, Rule][] = [
    [nr.chmod, { kind: 'mode', mode: 1 }], // chmod(path, mode)
    [nr.fchmod, { kind: 'mode', mode: 1 }], // fchmod(fd, mode)
    [nr.fchmodat, { kind: 'mode', mode: 2 }], // fchmodat(dfd, path, mode)
    [nr.fchmodat2, { kind: 'mode', mode: 2 }], // fchmodat2(dfd, path, mode, flags)
    [nr.creat, { kind: 'mode', mode: 1 }], // creat(path, mode): always creates
    [nr.open, { kind: 'mode', mode: 2, flags: 1 }], // open(path, flags, mode)
    [nr.openat, { kind: 'mode', mode: 3, flags: 2 }], // openat(dfd, path, flags, mode)
    [nr.mknod, { kind: 'mode', mode: 1 }], // mknod(path, mode, dev)
    [nr.mknodat, { kind: 'mode', mode: 2 }], // mknodat(dfd, path, mode, dev)
    [nr.openat2, refuse(ENOSYS)],
    [nr.io_uring_setup, refuse(ENOSYS)],
    [nr.io_uring_enter, refuse(ENOSYS)],
    [nr.io_uring_register, refuse(ENOSYS)],
    [nr.add_key, refuse(EPERM)],
    [nr.request_key, refuse(EPERM)],
    [nr.keyctl, refuse(EPERM)],
  ];
  return list.filter((entry): entry is [number, Rule] => entry[0] !== undefined);
}

type Label = string;
type Insn = { code: number; k: number; jt?: Label; jf?: Label } | { label: Label };

/** Lays out `insns`, resolving each jump to a label into its forward offset; 8 bytes per struct sock_filter. */
function assemble(insns: Insn[]): Buffer {
  const at = new Map<Label, number>();
  const code: Exclude<Insn, { label: Label }>[] = [];
  for (const insn of insns) {
    if ('label' in insn) at.set(insn.label, code.length);
    else code.push(insn);
  }
  const out = Buffer.alloc(code.length * 8);
  code.forEach((insn, i) => {
    const offset = (label: Label | undefined) => {
      if (label === undefined) return 0;
      const target = at.get(label);
      if (target === undefined) throw new Error(`seccomp: no label ${label}`);
      const jump = target - i - 1;
      if (jump < 0 || jump > 255) throw new Error(`seccomp: jump to ${label} out of range (${jump})`);
      return jump;
    };
    out.writeUInt16LE(insn.code, i * 8);
    out.writeUInt8(offset(insn.jt), i * 8 + 2);
    out.writeUInt8(offset(insn.jf), i * 8 + 3);
    out.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
  });
  return out;
}

/** The filter for `table`'s architecture, as bwrap reads it: struct sock_filter[], native (little) endian. */
export function seccompProgram(table: SyscallTable): Buffer {
  const ret = (k: number): Insn => ({ code: BPF_RET_K, k });
  const entries = rules(table);
  const insns: Insn[] = [
    { code: BPF_LD_W_ABS, k: ARCH_OFFSET },
    { code: BPF_JEQ_K, k: table.auditArch, jf: 'enosys' },
    { code: BPF_LD_W_ABS, k: NR_OFFSET },
    ...(table.foreignBit === undefined ? [] : [{ code: BPF_JGE_K, k: table.foreignBit, jt: 'enosys' }]),
    ...entries.map(([nr], i): Insn => ({ code: BPF_JEQ_K, k: nr, jt: `rule${i}` })),
    ret(SECCOMP_RET_ALLOW),
  ];
  entries.forEach(([, rule], i) => {
    insns.push({ label: `rule${i}` });
    if (rule.kind === 'refuse') {
      insns.push(ret(SECCOMP_RET_ERRNO | rule.errno));
      return;
    }
    if (rule.flags !== undefined) {
      insns.push({ code: BPF_LD_W_ABS, k: argLow(rule.flags) });
      insns.push({ code: BPF_JSET_K, k: O_CREAT | O_TMPFILE_BIT, jf: 'allow' });
    }
    insns.push({ code: BPF_LD_W_ABS, k: argLow(rule.mode) });
    insns.push({ code: BPF_JSET_K, k: S_ISUID | S_ISGID, jt: 'eperm', jf: 'allow' });
  });
  insns.push(
    { label: 'allow' },
    ret(SECCOMP_RET_ALLOW),
    { label: 'eperm' },
    ret(SECCOMP_RET_ERRNO | EPERM),
    { label: 'enosys' },
    ret(SECCOMP_RET_ERRNO | ENOSYS),
  );
  return assemble(insns);
}

let program: Buffer | undefined;

/**
 * This host's filter, built once per process. Throws NOT_SUPPORTED on an architecture with no table:
 * a bwrap sandbox there would run unfiltered.
 */
export function sandboxSeccompProgram(arch: NodeJS.Architecture = process.arch): Buffer {
  if (arch === process.arch && program) return program;
  const table = TABLES[arch];
  if (!table)
    throw new StasisError(
      'NOT_SUPPORTED',
      `the bwrap provider's seccomp filter has syscall tables for x64 and arm64 only, not ${arch}; bwrap sandboxes do not start unfiltered`,
    );
  const built = seccompProgram(table);
  if (arch === process.arch) program = built;
  return built;
}
