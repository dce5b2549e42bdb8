import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { z } from 'zod';
import { StasisError } from '../common/errors';
import { sha256Hex } from '../common/hashes';
import { hasErrorCode, makeDirDurable, stageFileAtomic, type StagedFile } from '../stores/atomic-file';
import { SandboxReleaseReceipt, type SandboxReleaseRequest } from './api';

// Release receipts on disk, one file per idempotency key, so a retried release
// gets the first outcome back (duplicate: true) even after the worker restarted.

const StoredReceipt = z.object({ requestHash: z.string(), receipt: SandboxReleaseReceipt });

/**
 * What makes two requests with one key "the same": mode and fence. The free-text
 * reason is left out, so a retry that words it differently is still a duplicate.
 */
export function releaseRequestHash(request: SandboxReleaseRequest): string {
  return sha256Hex(JSON.stringify([request.sandboxId, request.mode, request.fence]));
}

export class ReceiptStore {
  constructor(private readonly dir: string) {}

  /** The stored outcome for this key marked as a duplicate, or undefined; IDEMPOTENCY_CONFLICT when the key was used for a different request. */
  async replay(request: SandboxReleaseRequest): Promise<SandboxReleaseReceipt | undefined> {
    let text: string;
    try {
      text = await fs.readFile(this.fileOf(request.idempotencyKey), 'utf8');
    } catch (err) {
      if (hasErrorCode(err, 'ENOENT')) return undefined;
      throw err;
    }
    const stored = StoredReceipt.parse(JSON.parse(text));
    if (stored.requestHash !== releaseRequestHash(request)) {
      throw new StasisError(
        'IDEMPOTENCY_CONFLICT',
        `sandbox ${request.sandboxId}: idempotency key ${JSON.stringify(request.idempotencyKey)} was already used for a ${stored.receipt.mode} release at fence ${stored.receipt.fence}, not this ${request.mode} release at fence ${request.fence}`,
      );
    }
    return { ...stored.receipt, duplicate: true };
  }

  async save(request: SandboxReleaseRequest, receipt: SandboxReleaseReceipt): Promise<void> {
    await (await this.stage(request, receipt)).commit();
  }

  /** save() up to its last step: the receipt is durable beside its name; commit() gives it the name. */
  async stage(request: SandboxReleaseRequest, receipt: SandboxReleaseReceipt): Promise<StagedFile> {
    await makeDirDurable(this.dir);
    return stageFileAtomic(
      this.fileOf(request.idempotencyKey),
      JSON.stringify({ requestHash: releaseRequestHash(request), receipt }),
    );
  }

  /** Keys are hashed: they contain `/` and may be long. */
  private fileOf(idempotencyKey: string): string {
    return path.join(this.dir, `${sha256Hex(idempotencyKey)}.json`);
  }
}
