import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { JobJournal } from '../../providers/jobs';
import { tempDir } from './helpers';

// The exec job journal keeps what exactly-once needs (every job a retry could
// still come for) and nothing older: it stays bounded however many jobs run.
// Time passes by moving every file's mtime back, the way the journal ages them.

const MINUTE = 60 * 1000;
const job = (i: number) => ({ sandboxId: 'sbx-1', fence: 1, jobId: `job-${i}`, command: `echo ${i}` });
const outcome = (i: number) => ({ exitCode: 0, stdout: `${i}\n`, stderr: '' });

/** Makes everything in `dir` (entries, the sweep marker) `ms` older. */
async function age(dir: string, ms: number): Promise<void> {
  for (const name of await fs.readdir(dir)) {
    const file = path.join(dir, name);
    const { mtimeMs } = await fs.stat(file);
    const then = new Date(mtimeMs - ms);
    await fs.utimes(file, then, then);
  }
}

describe('job journal pruning', () => {
  it('stays bounded over hundreds of jobs while every recent job still answers with its first outcome', async () => {
    const dir = await tempDir('journal');
    const journal = new JobJournal(dir, { retentionMs: 30 * MINUTE });
    const jobs = 300;
    for (let i = 0; i < jobs; i += 1) {
      await journal.begin(job(i));
      await journal.finish(job(i), { outcome: outcome(i) });
      await age(dir, MINUTE); // a job a minute
    }
    const entries = (await fs.readdir(dir)).filter((n) => n.endsWith('.json'));
    // Half an hour of jobs, plus at most the ten minutes between two sweeps.
    expect(entries.length).toBeGreaterThanOrEqual(29);
    expect(entries.length).toBeLessThanOrEqual(41);
    // Every job of the last half hour is still known: its retry returns the first outcome and never runs again.
    for (let i = jobs - 29; i < jobs; i += 1) {
      expect(await journal.lookup(job(i))).toEqual({ kind: 'finished', outcome: outcome(i) });
    }
    // An unfinished job still refuses a second start.
    await journal.begin(job(jobs));
    await expect(journal.lookup(job(jobs))).rejects.toMatchObject({ code: 'JOB_INTERRUPTED' });
    // Long gone jobs are forgotten.
    expect(await journal.lookup(job(0))).toEqual({ kind: 'new' });
  });

  it('never prunes within the retention (a day by default), and prunes unfinished entries and stray temp files past it', async () => {
    const dir = await tempDir('journal-retention');
    const journal = new JobJournal(dir);
    await journal.begin(job(1));
    await journal.finish(job(1), { outcome: outcome(1) });
    await journal.begin(job(2)); // started, never finished (its worker died)
    await fs.writeFile(path.join(dir, 'stray.json.tmp-0123456789ab'), 'half');
    await age(dir, 23 * 60 * MINUTE);
    await journal.prune();
    expect(await journal.lookup(job(1))).toEqual({ kind: 'finished', outcome: outcome(1) });
    await expect(journal.lookup(job(2))).rejects.toMatchObject({ code: 'JOB_INTERRUPTED' });
    await age(dir, 2 * 60 * MINUTE);
    await journal.prune();
    expect(await journal.lookup(job(1))).toEqual({ kind: 'new' });
    expect(await journal.lookup(job(2))).toEqual({ kind: 'new' });
    expect((await fs.readdir(dir)).filter((n) => n !== '.pruned')).toEqual([]);
  });
});
