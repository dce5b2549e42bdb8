import { createHash } from 'node:crypto';
import * as fs from 'node:fs/promises';

/**
 * Every entry under `root` (a path, as a string or bytes), described by bytes alone: its path as hex
 * (names as readdir gives their bytes), its type, its permission bits, a file's content hash and
 * mtime (to the microsecond), a symlink's target bytes as hex. Nothing is followed, nothing decoded.
 */
export async function rawTree(root: string | Buffer): Promise<string[]> {
  const lines: string[] = [];
  const visit = async (dir: Buffer, relative: Buffer): Promise<void> => {
    const names = (await fs.readdir(dir, { encoding: 'buffer' })).sort(Buffer.compare);
    for (const name of names) {
      const where = Buffer.concat([dir, Buffer.from('/'), name]);
      const shown = Buffer.concat([relative, relative.length > 0 ? Buffer.from('/') : Buffer.alloc(0), name]);
      const stat = await fs.lstat(where, { bigint: true });
      const mode = (Number(stat.mode) & 0o7777).toString(8);
      const mtime = (stat.mtimeNs / 1000n).toString();
      if (stat.isSymbolicLink()) {
        lines.push(
          `${shown.toString('hex')} link ${(await fs.readlink(where, { encoding: 'buffer' })).toString('hex')}`,
        );
      } else if (stat.isDirectory()) {
        lines.push(`${shown.toString('hex')} dir ${mode}`);
        await visit(where, shown);
      } else {
        const hash = createHash('sha256')
          .update(await fs.readFile(where))
          .digest('hex');
        lines.push(`${shown.toString('hex')} file ${mode} ${mtime} ${hash}`);
      }
    }
  };
  await visit(Buffer.isBuffer(root) ? root : Buffer.from(root), Buffer.alloc(0));
  return lines;
}
