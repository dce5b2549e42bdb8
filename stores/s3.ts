import {
  AbortMultipartUploadCommand,
  DeleteObjectCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  paginateListObjectsV2,
  PutObjectCommand,
  S3Client,
  S3ServiceException,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { z } from 'zod';
import { StasisError } from '../common/errors';
import type { Checkpoint } from '../common/schemas';
import type { CheckpointStore, DownloadCheck, StoredObject } from './api';
import { abortReason } from './abort';
import { downloadChecked, HashingStream } from './hashing';
import { checkKey, checkPrefix, checkPutBytes } from './keys';

// Checkpoints in any S3-compatible store (MinIO locally, AWS S3 in production).
// Uploads stream through a hashing tee into a multipart upload, so a workspace
// of any size never sits in memory or on local disk twice. Objects already in
// memory (checkpoint packs, manifests) go in one PutObject (putBytes).

export interface S3StoreOptions {
  bucket: string;
  region: string;
  /** An S3-compatible endpoint such as http://127.0.0.1:9000; unset for AWS S3. */
  endpoint?: string;
  /** Unset: the SDK's default credential chain. */
  credentials?: { accessKeyId: string; secretAccessKey: string };
  /** Multipart part size (at least 5 MiB); at most two parts are buffered at once. */
  partSizeBytes?: number;
  /**
   * A request whose connection stays idle this long fails (default 120 s, as the
   * AWS SDK v2 did): a stalled store must fail the attempt, to be retried, rather
   * than hang it while the provider keeps heartbeating.
   */
  socketTimeoutMs?: number;
}

const DEFAULT_SOCKET_TIMEOUT_MS = 120_000;
/** SigV4's header for the payload's sha-256 (hex), which the signature covers. */
const PAYLOAD_SHA256_HEADER = 'x-amz-content-sha256';
const CONNECT_TIMEOUT_MS = 10_000;

/** Labels travel as one metadata entry, base64 JSON: S3 lowercases metadata keys and limits their characters. */
const LABELS_METADATA = 'stasis-labels';
const Labels = z.record(z.string(), z.string());

export class S3CheckpointStore implements CheckpointStore {
  readonly kind = 's3' as const;
  private readonly client: S3Client;

  constructor(private readonly options: S3StoreOptions) {
    this.client = new S3Client({
      region: options.region,
      ...(options.endpoint ? { endpoint: options.endpoint, forcePathStyle: true } : {}),
      ...(options.credentials ? { credentials: options.credentials } : {}),
      // Temporal retries the activity; a long SDK retry loop would only delay that.
      maxAttempts: 2,
      requestHandler: {
        connectionTimeout: CONNECT_TIMEOUT_MS,
        socketTimeout: options.socketTimeoutMs ?? DEFAULT_SOCKET_TIMEOUT_MS,
      },
      // sha-256 is verified end to end by Stasis; the SDK's extra checksums break some S3-compatible stores.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    });
  }

  async put(key: string, body: Readable, labels: Record<string, string>, signal?: AbortSignal): Promise<Checkpoint> {
    checkKey(key);
    const hasher = new HashingStream();
    // Piped (so listened to) before the first await: a body failing meanwhile was an unhandled 'error'.
    const feeding = pipeline(body, hasher).catch((err: unknown) => err);
    try {
      // A worker killed mid-upload leaves its multipart upload open; the retry under the same key ends it.
      await this.abortUploads(key, (upload) => upload === key);
    } catch (err) {
      hasher.destroy();
      body.destroy();
      await feeding;
      throw err;
    }
    // Cancelling ends the body with an error, so the upload fails the normal way and aborts its multipart upload itself.
    const onAbort = () => hasher.destroy(abortReason(signal, 'checkpoint upload'));
    signal?.addEventListener('abort', onAbort, { once: true });
    const upload = new Upload({
      client: this.client,
      params: {
        Bucket: this.options.bucket,
        Key: key,
        Body: hasher,
        ContentType: 'application/gzip',
        Metadata: { [LABELS_METADATA]: Buffer.from(JSON.stringify(labels)).toString('base64') },
      },
      partSize: this.options.partSizeBytes ?? 16 * 1024 * 1024,
      queueSize: 2,
      leavePartsOnError: false,
    });
    try {
      await upload.done();
      if (signal?.aborted) throw abortReason(signal, 'checkpoint upload');
      const feedError = await feeding;
      if (feedError) throw feedError;
      return { uri: `s3://${this.options.bucket}/${key}`, sha256: hasher.digest(), bytes: hasher.bytes };
    } catch (err) {
      // A single-part upload can complete just as it is cancelled: leave nothing under the key.
      await this.client.send(new DeleteObjectCommand({ Bucket: this.options.bucket, Key: key })).catch(() => undefined);
      throw signal?.aborted ? abortReason(signal, 'checkpoint upload') : err;
    } finally {
      signal?.removeEventListener('abort', onAbort);
      body.destroy();
    }
  }

  async putBytes(
    key: string,
    bytes: Buffer,
    labels: Record<string, string>,
    signal?: AbortSignal,
    given?: string,
  ): Promise<Checkpoint> {
    checkKey(key);
    checkPutBytes(key, bytes);
    if (given !== undefined && !/^[0-9a-f]{64}$/.test(given))
      throw new Error(`putBytes ${key}: ${given} is no sha-256`);
    if (signal?.aborted) throw abortReason(signal, 'checkpoint upload');
    // No ListMultipartUploads first (put's costs a request per object): putBytes never starts a multipart
    // upload, and the keys it writes (packs, segments, manifests) are written by nothing else, so none
    // can be open under them.
    // The caller's, if given (hashed off the event loop): the store refuses the put if the bytes do not match it.
    const sha256 = given ?? createHash('sha256').update(bytes).digest('hex');
    try {
      const command = new PutObjectCommand({
        Bucket: this.options.bucket,
        Key: key,
        Body: bytes,
        ContentLength: bytes.length,
        ContentType: 'application/octet-stream',
        Metadata: { [LABELS_METADATA]: Buffer.from(JSON.stringify(labels)).toString('base64') },
      });
      // The signature covers the payload's sha-256, which the store checks against the bytes it receives.
      // Given as computed here, the signer does not hash the bytes a second time (~15% of the main
      // thread's CPU in a first checkpoint); a body damaged on its way is still refused.
      command.middlewareStack.add(
        (next) => (args) => {
          const request = args.request as { headers?: Record<string, string> };
          if (request.headers) request.headers[PAYLOAD_SHA256_HEADER] = sha256;
          return next(args);
        },
        { step: 'build', name: 'stasisPayloadSha256' },
      );
      await this.client.send(command, signal ? { abortSignal: signal } : {});
      if (signal?.aborted) throw abortReason(signal, 'checkpoint upload');
      return { uri: this.uriOf(key), sha256, bytes: bytes.length };
    } catch (err) {
      // Nothing is deleted: the key may name bytes an earlier checkpoint needs (see CheckpointStore.putBytes).
      throw signal?.aborted ? abortReason(signal, 'checkpoint upload') : err;
    }
  }

  async download(
    checkpoint: Checkpoint,
    file: string,
    signal?: AbortSignal,
    verify?: DownloadCheck,
  ): Promise<{ labels: Record<string, string> }> {
    const { bucket, key } = parseUri(checkpoint.uri);
    try {
      const response = await this.client.send(
        new GetObjectCommand({ Bucket: bucket, Key: key }),
        signal ? { abortSignal: signal } : {},
      );
      if (!(response.Body instanceof Readable)) throw new Error(`GetObject for ${checkpoint.uri} returned no stream`);
      await downloadChecked(response.Body, checkpoint, file, signal, verify);
      return { labels: decodeLabels(response.Metadata?.[LABELS_METADATA], checkpoint.uri) };
    } catch (err) {
      if (isNotFound(err))
        throw new StasisError('NOT_FOUND', `checkpoint ${checkpoint.uri} does not exist in the store`);
      throw err;
    }
  }

  uriOf(key: string): string {
    return `s3://${this.options.bucket}/${checkKey(key)}`;
  }

  async delete(uri: string): Promise<void> {
    const { bucket, key } = parseUri(uri);
    await this.client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
  }

  async deletePrefix(prefix: string): Promise<number> {
    checkPrefix(prefix);
    let deleted = 0;
    for await (const page of paginateListObjectsV2(
      { client: this.client },
      { Bucket: this.options.bucket, Prefix: prefix },
    )) {
      // One request per page (at most 1,000 keys, DeleteObjects' limit too): a destroy after a Run's one cycle sent
      // three DeleteObject requests, one by one.
      const keys = (page.Contents ?? []).flatMap(({ Key }) => (Key ? [{ Key }] : []));
      if (keys.length === 0) continue;
      const result = await this.client.send(
        new DeleteObjectsCommand({ Bucket: this.options.bucket, Delete: { Objects: keys, Quiet: true } }),
      );
      const failed = result.Errors ?? [];
      if (failed.length > 0) {
        const { Key, Code, Message } = failed[0];
        throw new Error(
          `deleting ${failed.length} of ${keys.length} objects under ${prefix} failed, first ${Key}: ${Code ?? ''} ${Message ?? ''}`,
        );
      }
      deleted += keys.length;
    }
    // AWS S3 lists uploads by prefix; MinIO only by exact key (it expires stale uploads itself, after 24 h by default).
    await this.abortUploads(prefix, (key) => key.startsWith(prefix));
    return deleted;
  }

  async read(uri: string, maxBytes: number, signal?: AbortSignal): Promise<Buffer> {
    const { bucket, key } = parseUri(uri);
    try {
      const response = await this.client.send(
        new GetObjectCommand({ Bucket: bucket, Key: key }),
        signal ? { abortSignal: signal } : {},
      );
      if (!(response.Body instanceof Readable)) throw new Error(`GetObject for ${uri} returned no stream`);
      if ((response.ContentLength ?? 0) > maxBytes) {
        response.Body.destroy();
        throw new StasisError('CHECKPOINT_INVALID', `checkpoint object ${uri} is larger than ${maxBytes} bytes`);
      }
      const parts: Buffer[] = [];
      let bytes = 0;
      for await (const part of response.Body) {
        // A response without a length (chunked transfer) is held to the bound as it arrives.
        bytes += (part as Buffer).length;
        if (bytes > maxBytes) {
          response.Body.destroy();
          throw new StasisError('CHECKPOINT_INVALID', `checkpoint object ${uri} is larger than ${maxBytes} bytes`);
        }
        parts.push(part as Buffer);
      }
      return Buffer.concat(parts, bytes);
    } catch (err) {
      if (isNotFound(err)) throw new StasisError('NOT_FOUND', `checkpoint ${uri} does not exist in the store`);
      throw err;
    }
  }

  async list(prefix: string): Promise<StoredObject[]> {
    checkPrefix(prefix);
    const objects: StoredObject[] = [];
    for await (const page of paginateListObjectsV2(
      { client: this.client },
      { Bucket: this.options.bucket, Prefix: prefix },
    )) {
      for (const { Key, LastModified } of page.Contents ?? []) {
        if (Key)
          objects.push({ key: Key, uri: `s3://${this.options.bucket}/${Key}`, modified: LastModified ?? new Date(0) });
      }
    }
    return objects;
  }

  /** Aborts the unfinished multipart uploads listed under `prefix` whose key `matches`. */
  private async abortUploads(prefix: string, matches: (key: string) => boolean): Promise<void> {
    let markers: { KeyMarker?: string; UploadIdMarker?: string } = {};
    for (;;) {
      const page = await this.client.send(
        new ListMultipartUploadsCommand({ Bucket: this.options.bucket, Prefix: prefix, ...markers }),
      );
      for (const { Key, UploadId } of page.Uploads ?? []) {
        if (Key === undefined || UploadId === undefined || !matches(Key)) continue;
        await this.client
          .send(new AbortMultipartUploadCommand({ Bucket: this.options.bucket, Key, UploadId }))
          .catch((err: unknown) => {
            if (!isNotFound(err)) throw err; // ended meanwhile
          });
      }
      if (!page.IsTruncated) return;
      markers = {
        ...(page.NextKeyMarker ? { KeyMarker: page.NextKeyMarker } : {}),
        ...(page.NextUploadIdMarker ? { UploadIdMarker: page.NextUploadIdMarker } : {}),
      };
    }
  }

  async exists(uri: string): Promise<boolean> {
    const { bucket, key } = parseUri(uri);
    try {
      await this.client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }));
      return true;
    } catch (err) {
      if (isNotFound(err)) return false;
      throw err;
    }
  }
}

function parseUri(uri: string): { bucket: string; key: string } {
  const match = /^s3:\/\/([^/]+)\/(.+)$/.exec(uri);
  if (!match)
    throw new StasisError('INVALID_ARGUMENT', `checkpoint uri ${JSON.stringify(uri)} is not an s3://bucket/key uri`);
  return { bucket: match[1], key: checkKey(match[2]) };
}

function decodeLabels(encoded: string | undefined, uri: string): Record<string, string> {
  if (encoded === undefined) return {};
  const parsed = Labels.safeParse(safeJson(Buffer.from(encoded, 'base64').toString('utf8')));
  if (!parsed.success) throw new StasisError('CHECKPOINT_INVALID', `checkpoint ${uri} has unreadable labels metadata`);
  return parsed.data;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function isNotFound(err: unknown): boolean {
  return (
    err instanceof S3ServiceException &&
    (err.name === 'NoSuchKey' || err.name === 'NotFound' || err.$metadata.httpStatusCode === 404)
  );
}
