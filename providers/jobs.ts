import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { z } from 'zod';
import { StasisError } from '../common/errors';
import { sha256Hex } from '../common/hashes';
import { hasErrorCode, makeDirDurable, writeFileAtomic } from '../stores/atomic-file';
import type { ExecOutcome, ProviderExecRequest } from './api';

// Exec jobs on disk, one file per job id, so a retried exec never runs a command
// twice. Temporal retries an exec whose attempt was lost on the way (a task or a
// completion that never arrived shows up as a heartbeat timeout): a job that never
// started runs then, a finished one returns its outcome again, and one that an
// earlier worker process started but never finished is refused, because whether
// and how far it ran is unknown.

const StoredJob = z.object({
  requestHash: z.string(),
  outcome: z.object({ exitCode: z.number(), stdout: z.string(), stderr: z.string() }).optional(),
  /** Set when the attempt that ran the command failed after starting it. */
  error: z.string().optional(),
});
type StoredJob = z.infer<typeof StoredJob>;

/** What makes two requests with one job id the same job: the command and its inputs. */
function requestHash(request: ProviderExecRequest): string {
  return sha256Hex(JSON.stringify([request.command, request.env ?? {}, request.timeoutMs ?? null]));
}

export type JobLookup = { kind: 'new' } | { kind: 'finished'; outcome: ExecOutcome };

export interface JobJournalOptions {
  /**
   * How long a job's entry is kept after it was last written. A retry of an exec
   * can only come while its activity is still open (a few attempts of at most
   * 30 minutes each), so a day keeps every entry exactly-once needs, and the
   * journal holds at most a day of jobs.
   */
  retentionMs?: number;
}

const DEFAULT_RETENTION_MS = 24 * 60 * 60 * 1000;
/** A journal is swept at most this often, by the next job that begins. */
const PRUNE_EVERY_MS = 10 * 60 * 1000;
/** Its mtime is when the journal was last swept. */
const PRUNED_MARKER = '.pruned';

export class JobJournal {
  private readonly retentionMs: number;

  constructor(
    private readonly dir: string,
    options: JobJournalOptions = {},
  ) {
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
  }

  /**
   * Whether the job may start. A finished job returns its outcome; a job id used for
   * another command is IDEMPOTENCY_CONFLICT; a job started by an earlier attempt that
   * did not finish is JOB_INTERRUPTED.
   */
  async lookup(request: ProviderExecRequest): Promise<JobLookup> {
    const stored = await this.read(request.jobId);
    if (!stored) return { kind: 'new' };
    if (stored.requestHash !== requestHash(request)) {
      throw new StasisError(
        'IDEMPOTENCY_CONFLICT',
        `sandbox ${request.sandboxId}: job id ${JSON.stringify(request.jobId)} was already used for another command`,
      );
    }
    if (stored.outcome) return { kind: 'finished', outcome: stored.outcome };
    throw new StasisError(
      'JOB_INTERRUPTED',
      `sandbox ${request.sandboxId}: job ${request.jobId} was started by an earlier attempt that ${
        stored.error ? `failed (${stored.error})` : 'stopped with its worker'
      }; it is not run again`,
    );
  }

  /** Recorded before the command starts, so no later attempt can start it again. */
  async begin(request: ProviderExecRequest): Promise<void> {
    await this.write(request.jobId, { requestHash: requestHash(request) });
    await this.pruneIfDue();
  }

  /**
   * Deletes the entries (finished or not) and stray temp files last written
   * longer than the retention ago: no retry can still come for them.
   */
  async prune(): Promise<void> {
    let names: string[];
    try {
      names = await fs.readdir(this.dir);
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return;
      throw err;
    }
    const cutoff = Date.now() - this.retentionMs;
    for (const name of names) {
      if (name === PRUNED_MARKER) continue;
      const file = path.join(this.dir, name);
      const stat = await fs.stat(file).catch(() => undefined);
      if (stat && stat.mtimeMs < cutoff) await fs.rm(file, { force: true });
    }
  }

  private async pruneIfDue(): Promise<void> {
    const marker = path.join(this.dir, PRUNED_MARKER);
    const last = await fs.stat(marker).then(
      (stat) => stat.mtimeMs,
      () => undefined,
    );
    if (last !== undefined && Date.now() - last < PRUNE_EVERY_MS) return;
    await this.prune();
    await fs.writeFile(marker, '');
  }

  /** The command never started (the spawn failed): a retry may run it. */
  async forget(request: ProviderExecRequest): Promise<void> {
    await fs.rm(this.fileOf(request.jobId), { force: true });
  }

  async finish(request: ProviderExecRequest, result: { outcome: ExecOutcome } | { error: string }): Promise<void> {
    await this.write(request.jobId, { requestHash: requestHash(request), ...result });
  }

  private async read(jobId: string): Promise<StoredJob | undefined> {
    try {
      return StoredJob.parse(JSON.parse(await fs.readFile(this.fileOf(jobId), 'utf8')));
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return undefined;
      throw err;
    }
  }

  private async write(jobId: string, job: StoredJob): Promise<void> {
    await makeDirDurable(this.dir);
    await writeFileAtomic(this.fileOf(jobId), JSON.stringify(job));
  }

  /** Job ids are hashed: they are caller-chosen strings. */
  private fileOf(jobId: string): string {
    return path.join(this.dir, `${sha256Hex(jobId)}.json`);
  }
}
