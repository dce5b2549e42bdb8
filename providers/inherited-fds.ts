import * as fs from 'node:fs';

/** Linux's O_CLOEXEC as /proc/<pid>/fdinfo shows it in `flags` (octal; the same on x86-64 and arm64). */
const O_CLOEXEC = 0o2000000;

/**
 * Closes every descriptor above stdio that this process inherited open across exec (no close-on-exec
 * flag) and returns their numbers. Node opens all of its own with the flag, so what lacks it came
 * from whoever started the worker (a shell, a supervisor, a CI runner: a pipe's write end, a log
 * file), and every process started from here would inherit it in turn: a sandbox's code could write
 * into that pipe or read that file. The process starter calls it first (spawner-main.ts).
 */
export function closeInheritedDescriptors(): number[] {
  const closed: number[] = [];
  for (const name of fs.readdirSync('/proc/self/fd')) {
    const fd = Number(name);
    if (!Number.isInteger(fd) || fd <= 2) continue;
    let info: string;
    try {
      info = fs.readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8');
    } catch {
      continue; // the listing's own descriptor, closed by now
    }
    const flags = /^flags:\s*([0-7]+)$/m.exec(info)?.[1];
    if (flags === undefined || (parseInt(flags, 8) & O_CLOEXEC) !== 0) continue;
    try {
      fs.closeSync(fd);
      closed.push(fd);
    } catch {
      // closed meanwhile
    }
  }
  return closed;
}
