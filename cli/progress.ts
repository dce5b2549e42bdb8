import type { CliContext } from './context';

// Long operations (provisioning, snapshot upload, checkpoint restore) show that
// they are alive: a spinner with the elapsed time on a terminal, a start line,
// a line every 15 s and an end line otherwise. Always on stderr.

const FRAMES = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

export async function withProgress<T>(ctx: CliContext, label: string, work: Promise<T>): Promise<T> {
  const stderr = ctx.io.stderr;
  const started = Date.now();
  const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)} s`;
  let frame = 0;
  const timer = stderr.isTTY
    ? setInterval(() => stderr.write(`\r${FRAMES[frame++ % FRAMES.length]} ${label} (${elapsed()})\x1b[K`), 100)
    : setInterval(() => stderr.write(`${label}: still working (${elapsed()})\n`), 15_000);
  if (!stderr.isTTY) stderr.write(`${label}…\n`);
  try {
    const result = await work;
    stderr.write(`${stderr.isTTY ? '\r\x1b[K' : ''}${label}: done in ${elapsed()}\n`);
    return result;
  } catch (err) {
    if (stderr.isTTY) stderr.write('\r\x1b[K');
    throw err;
  } finally {
    clearInterval(timer);
  }
}
