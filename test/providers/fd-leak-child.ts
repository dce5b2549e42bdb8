// Run by spawner.test.ts as a worker would be: started with descriptors it did not open (no
// close-on-exec), it starts a process through the process starter and prints what that process holds
// open, after a line with what this one holds.
//   node -r scripts/register-ts.js test/providers/fd-leak-child.ts
import * as fs from 'node:fs';
import { startProcess } from '../../providers/spawner';

const links = (dir: string) =>
  fs
    .readdirSync(dir)
    .map((fd) => {
      try {
        return fs.readlinkSync(`${dir}/${fd}`);
      } catch {
        return '';
      }
    })
    .join(' ');

const keep = setInterval(() => undefined, 1000); // the starter and its channel do not keep a process alive
void (async () => {
  const started = await startProcess({
    file: '/bin/sh',
    args: ['-c', 'for f in /proc/$$/fd/*; do readlink "$f"; done; exit 0'],
    cwd: '/',
    env: { PATH: '/usr/bin:/bin' },
    background: false,
    maxOutputBytes: 1 << 16,
  });
  const exit = await started.exited;
  process.stdout.write(`${links('/proc/self/fd')}\n${exit.stdout.split('\n').join(' ')}\n`, () => {
    clearInterval(keep);
    process.exit(exit.code ?? 1);
  });
})();
