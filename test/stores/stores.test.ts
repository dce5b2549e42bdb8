import { CreateMultipartUploadCommand, ListMultipartUploadsCommand, ListObjectsV2Command } from '@aws-sdk/client-s3';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { Readable } from 'node:stream';
import fc from 'fast-check';
import type { CheckpointStore } from '../../stores/api';
import { MAX_PUT_BYTES } from '../../stores/keys';
import { FsCheckpointStore } from '../../stores/fs';
import { createCheckpointStore } from '../../stores/index';
import { loadConfig } from '../../common/config';
import { testS3 } from '../helpers/s3';
import { listTree, s3StoreFromEnv, sha256File, stasisError, tempDir, uniqueId } from '../providers/helpers';
import { behindProxy } from './cas-helpers';

// Both checkpoint stores against the same contract, with real files and a real MinIO.

/** An endless stream of random 256 KiB chunks, one every few milliseconds, to cancel mid-upload. */
function endless(): Readable {
  return new Readable({
    read() {
      setTimeout(() => this.push(randomBytes(256 * 1024)), 2);
    },
  });
}

const bucket = () => process.env.STASIS_S3_BUCKET ?? 'stasis';

const stores: {
  kind: string;
  make: () => Promise<{ store: CheckpointStore; leftovers: (prefix: string) => Promise<string[]> }>;
}[] = [
  {
    kind: 'fs',
    make: async () => {
      const dir = await tempDir('fs-store');
      return {
        store: new FsCheckpointStore(dir),
        leftovers: async (prefix) => (await listTree(dir)).filter((p) => p.startsWith(prefix) && p !== prefix),
      };
    },
  },
  {
    kind: 's3',
    make: async () => ({
      store: s3StoreFromEnv(5 * 1024 * 1024),
      leftovers: async (prefix) => {
        const client = testS3();
        const objects = await client.send(new ListObjectsV2Command({ Bucket: bucket(), Prefix: prefix }));
        const uploads = await client.send(new ListMultipartUploadsCommand({ Bucket: bucket(), Prefix: prefix }));
        return [
          ...(objects.Contents ?? []).map((o) => `object ${o.Key}`),
          ...(uploads.Uploads ?? []).map((u) => `upload ${u.Key}`),
        ];
      },
    }),
  },
];

describe.each(stores)('$kind checkpoint store', ({ make }) => {
  it('streams a multipart-sized object in, with labels, and back out verified', async () => {
    const { store } = await make();
    const work = await tempDir('store-data');
    const source = path.join(work, 'source');
    await fs.writeFile(source, randomBytes(12 * 1024 * 1024 + 17)); // spans three 5 MiB parts
    const key = `checkpoints/${uniqueId('sbx')}/1-a.tar.gz`;
    const labels = { run: 'R'.repeat(64), Spec: 'mixed Case ü', policy: 'p' };
    const checkpoint = await store.put(key, createReadStream(source), labels);
    expect(checkpoint.uri).toMatch(store.kind === 's3' ? `s3://${bucket()}/${key}` : /^file:\/\//);
    expect(checkpoint.bytes).toBe(12 * 1024 * 1024 + 17);
    expect(checkpoint.sha256).toBe(await sha256File(source));
    expect(await store.exists(checkpoint.uri)).toBe(true);

    const copy = path.join(work, 'copy');
    expect(await store.download(checkpoint, copy)).toEqual({ labels });
    expect(await sha256File(copy)).toBe(checkpoint.sha256);

    await store.delete(checkpoint.uri);
    expect(await store.exists(checkpoint.uri)).toBe(false);
    await stasisError(store.download(checkpoint, path.join(work, 'gone')), 'NOT_FOUND');
    await store.delete(checkpoint.uri); // idempotent
  });

  it('refuses a download whose sha-256 or size differs from the checkpoint record', async () => {
    const { store } = await make();
    const work = await tempDir('store-verify');
    const checkpoint = await store.put(
      `checkpoints/${uniqueId('sbx')}/1-b.tar.gz`,
      Readable.from([Buffer.from('hello')]),
      {},
    );
    const target = path.join(work, 'copy');
    const err = await stasisError(
      store.download({ ...checkpoint, sha256: '0'.repeat(64) }, target),
      'CHECKPOINT_INVALID',
    );
    expect(err.message).toContain('is corrupt');
    await stasisError(store.download({ ...checkpoint, bytes: 6 }, target), 'CHECKPOINT_INVALID');
    await expect(fs.access(target)).rejects.toThrow(); // no half-verified file is left
  });

  it("checks only the size when asked to ('size', for packs whose reader hashes each chunk)", async () => {
    const { store } = await make();
    const work = await tempDir('store-size');
    const checkpoint = await store.put(
      `checkpoints/${uniqueId('sbx')}/1-s.tar.gz`,
      Readable.from([Buffer.from('hello')]),
      {},
    );
    const target = path.join(work, 'copy');
    // Another hash in the record is not looked at: the bytes are the caller's to check.
    await store.download({ ...checkpoint, sha256: '0'.repeat(64) }, target, undefined, 'size');
    expect(await fs.readFile(target, 'utf8')).toBe('hello');
    await fs.rm(target);
    for (const bytes of [4, 6]) {
      const err = await stasisError(
        store.download({ ...checkpoint, bytes }, target, undefined, 'size'),
        'CHECKPOINT_INVALID',
      );
      expect(err.message).toContain(checkpoint.uri);
      await expect(fs.access(target)).rejects.toThrow();
    }
  });

  it('leaves no file behind a download refused on its first chunk, however early it fails', async () => {
    // The refusal can come before the target file is even opened: removing it at once raced the open (CI).
    const { store } = await make();
    const work = await tempDir('store-early');
    const checkpoint = await store.put(
      `checkpoints/${uniqueId('sbx')}/1-e.tar.gz`,
      Readable.from([Buffer.from('hello')]),
      {},
    );
    // Many at once, so the file system's thread pool is busy and an open can lag behind a removal.
    for (let round = 0; round < 4; round++) {
      await Promise.all(
        Array.from({ length: 32 }, async (_, i) => {
          const target = path.join(work, `copy-${round}-${i}`);
          const bytes = 1 + (i % 4);
          const verify = i % 2 === 0 ? 'size' : 'sha256';
          await stasisError(store.download({ ...checkpoint, bytes }, target, undefined, verify), 'CHECKPOINT_INVALID');
        }),
      );
    }
    expect(await fs.readdir(work)).toEqual([]);
  });

  it('leaves nothing under the key when the upload is cancelled or its source fails', async () => {
    const { store, leftovers } = await make();
    const prefix = `checkpoints/${uniqueId('cancel')}/`;
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('cancelled by test')), 400);
    await expect(store.put(`${prefix}1-c.tar.gz`, endless(), {}, controller.signal)).rejects.toThrow(
      'cancelled by test',
    );

    const failing = new Readable({ read() {} });
    failing.push(randomBytes(6 * 1024 * 1024));
    setTimeout(() => failing.destroy(new Error('disk read failed')), 200);
    await expect(store.put(`${prefix}2-d.tar.gz`, failing, {})).rejects.toThrow('disk read failed');
    expect(await leftovers(prefix)).toEqual([]);
  });

  it('deletes every checkpoint under a sandbox prefix, and nothing beside it', async () => {
    const { store, leftovers } = await make();
    const prefix = `checkpoints/${uniqueId('prefix')}/`;
    const neighbour = `checkpoints/${uniqueId('prefix')}/1-a.tar.gz`;
    for (const name of ['1-a.tar.gz', '2-b.tar.gz', '3-c.tar.gz'])
      await store.put(`${prefix}${name}`, Readable.from([randomBytes(100)]), { n: name });
    const kept = await store.put(neighbour, Readable.from([Buffer.from('kept')]), {});
    expect(await store.deletePrefix(prefix)).toBe(3);
    expect(await leftovers(prefix)).toEqual([]);
    expect(await store.exists(kept.uri)).toBe(true);
    expect(await store.deletePrefix(prefix)).toBe(0); // idempotent
    await stasisError(store.deletePrefix('checkpoints/'), 'INVALID_ARGUMENT');
    await stasisError(store.deletePrefix('checkpoints/../'), 'INVALID_ARGUMENT');
    await stasisError(store.deletePrefix(`${prefix}1-a.tar.gz`), 'INVALID_ARGUMENT');
  });

  it('deletes a prefix of more objects than one listing page holds (1,000), and nothing beside it', async () => {
    const { store, leftovers } = await make();
    const prefix = `checkpoints/${uniqueId('prefix')}/`;
    const kept = await store.putBytes(`checkpoints/${uniqueId('prefix')}/1-a.tar.gz`, Buffer.from('kept'), {});
    const names = Array.from({ length: 1_003 }, (_, i) => `${prefix}pack-${i}`);
    for (let i = 0; i < names.length; i += 50) {
      await Promise.all(names.slice(i, i + 50).map((name) => store.putBytes(name, Buffer.from(name), {})));
    }
    expect(await store.deletePrefix(prefix)).toBe(names.length);
    expect(await leftovers(prefix)).toEqual([]);
    expect(await store.exists(kept.uri)).toBe(true);
  }, 120_000);

  it('putBytes stores bytes in one request: sha-256, size, labels and bytes come back as given', async () => {
    const { store } = await make();
    const work = await tempDir('store-bytes');
    const prefix = `checkpoints/${uniqueId('bytes')}/`;
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ maxLength: 300 }),
          fc.integer({ min: 1, max: 9 * 1024 * 1024 }).map((n) => randomBytes(n)),
        ),
        fc.dictionary(fc.string({ minLength: 1, maxLength: 8 }), fc.string({ maxLength: 20 }), { maxKeys: 3 }),
        async (raw, labels) => {
          const bytes = Buffer.from(raw);
          const key = `${prefix}${uniqueId('o')}.pack`;
          const stored = await store.putBytes(key, bytes, labels);
          expect(stored).toEqual({
            uri: store.kind === 's3' ? `s3://${bucket()}/${key}` : expect.stringMatching(/^file:\/\//),
            sha256: createHash('sha256').update(bytes).digest('hex'),
            bytes: bytes.length,
          });
          expect((await store.read(stored.uri, bytes.length)).equals(bytes)).toBe(true);
          const copy = path.join(work, 'copy');
          expect(await store.download(stored, copy)).toEqual({ labels });
          // Written again under the same key (a retried attempt): the new bytes replace the old.
          const again = await store.putBytes(key, Buffer.concat([bytes, Buffer.from('!')]), {});
          expect(again.bytes).toBe(bytes.length + 1);
          expect(store.uriOf(key)).toBe(stored.uri);
          await store.delete(stored.uri);
        },
      ),
      { numRuns: 12 },
    );
    await store.deletePrefix(prefix);
  });

  it('putBytes cancelled before or during its request leaves nothing or the whole object, and refuses too large', async () => {
    const { store, leftovers } = await make();
    const prefix = `checkpoints/${uniqueId('bytes-cancel')}/`;
    const before = new AbortController();
    before.abort(new Error('cancelled before'));
    await expect(store.putBytes(`${prefix}a.pack`, randomBytes(1000), {}, before.signal)).rejects.toThrow(
      'cancelled before',
    );
    let cancelled = 0;
    for (const wait of [0, 1, 5, 20]) {
      const key = `${prefix}b${wait}.pack`;
      const bytes = randomBytes(8 * 1024 * 1024);
      const during = new AbortController();
      const putting = store.putBytes(key, bytes, {}, during.signal);
      setTimeout(() => during.abort(new Error('cancelled during')), wait);
      const outcome = await putting.then(
        (stored) => stored,
        (err: unknown) => err as Error,
      );
      if (outcome instanceof Error) {
        expect(outcome.message).toBe('cancelled during');
        cancelled += 1;
      }
      // One request: the key holds nothing or all of the bytes, never a part (GC collects an unnamed one).
      if (await store.exists(store.uriOf(key)))
        expect((await store.read(store.uriOf(key), bytes.length)).equals(bytes)).toBe(true);
      await store.delete(store.uriOf(key));
    }
    expect(cancelled).toBeGreaterThan(0);
    const tooLarge = Buffer.alloc(MAX_PUT_BYTES + 1);
    const err = await stasisError(store.putBytes(`${prefix}c.pack`, tooLarge, {}), 'INVALID_ARGUMENT');
    expect(err.message).toContain(`more than the ${MAX_PUT_BYTES}`);
    await stasisError(store.putBytes('checkpoints/../x', Buffer.from('x'), {}), 'INVALID_ARGUMENT');
    expect(await leftovers(prefix)).toEqual([]);
  });

  it('a failed or cancelled putBytes of bytes already stored under their name keeps them (an earlier checkpoint names them)', async () => {
    const { store } = await make();
    const work = await tempDir('store-bytes-keep');
    const key = `checkpoints/${uniqueId('bytes-keep')}/packs/${'a'.repeat(64)}.pack`;
    const bytes = randomBytes(8 * 1024 * 1024);
    const earlier = await store.putBytes(key, bytes, {});
    for (const wait of [0, 1, 5, 20]) {
      const during = new AbortController();
      const putting = store.putBytes(key, bytes, {}, during.signal);
      setTimeout(() => during.abort(new Error('cancelled during')), wait);
      await putting.catch(() => undefined);
      // The earlier checkpoint's pack is still there, whole and verified.
      await store.download(earlier, path.join(work, `copy-${wait}`));
      expect(await sha256File(path.join(work, `copy-${wait}`))).toBe(earlier.sha256);
    }
    await store.delete(earlier.uri);
  });

  it('refuses keys outside checkpoints/', async () => {
    const { store } = await make();
    await stasisError(store.put('../escape', Readable.from([Buffer.from('x')]), {}), 'INVALID_ARGUMENT');
    await stasisError(store.put('checkpoints/../x', Readable.from([Buffer.from('x')]), {}), 'INVALID_ARGUMENT');
  });
});

describe('a put after a killed put of the same key', () => {
  it('s3: aborts the multipart upload the killed put left open', async () => {
    const client = testS3();
    const key = `checkpoints/${uniqueId('killed')}/1-a.tar.gz`;
    await client.send(new CreateMultipartUploadCommand({ Bucket: bucket(), Key: key }));
    const open = async () =>
      ((await client.send(new ListMultipartUploadsCommand({ Bucket: bucket(), Prefix: key }))).Uploads ?? []).filter(
        (u) => u.Key === key,
      ).length;
    expect(await open()).toBe(1);
    const checkpoint = await s3StoreFromEnv(5 * 1024 * 1024).put(key, Readable.from([Buffer.from('retry')]), {});
    expect(await open()).toBe(0);
    expect(checkpoint.bytes).toBe(5);
  });

  it('fs: removes the temp file the killed put left', async () => {
    const dir = await tempDir('fs-killed');
    const key = `checkpoints/${uniqueId('killed')}/1-a.tar.gz`;
    await fs.mkdir(path.join(dir, path.dirname(key)), { recursive: true });
    await fs.writeFile(path.join(dir, `${key}.tmp-0123456789ab`), randomBytes(1000));
    await new FsCheckpointStore(dir).put(key, Readable.from([Buffer.from('retry')]), {});
    expect((await listTree(dir)).filter((p) => p.includes('.tmp-'))).toEqual([]);
  });
});

/** The test bucket's store, reached through a fault proxy at `endpoint`. */
describe('a deletePrefix the store answers with a failed key', () => {
  it('s3: rejects naming the key, and keeps what it did not delete; the retry deletes all', async () => {
    const prefix = `checkpoints/${uniqueId('delete-errors')}/`;
    await behindProxy(async (proxy, store) => {
      for (const name of ['a', 'b']) await store.putBytes(`${prefix}${name}`, Buffer.from(name), {});
      // What S3 answers when it could not delete a key (HTTP 200, an Error per key in the DeleteResult).
      proxy.answer = ({ method, path }) =>
        method === 'POST' && path.includes('delete')
          ? `<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Error><Key>${prefix}b</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error></DeleteResult>`
          : undefined;
      await expect(store.deletePrefix(prefix)).rejects.toThrow(`${prefix}b: AccessDenied Access Denied`);
      expect(proxy.requests.filter((r) => r.outcome === 'answered')).toHaveLength(1);
      expect((await store.list(prefix)).map((o) => o.key)).toEqual([`${prefix}a`, `${prefix}b`]);
      proxy.answer = undefined;
      expect(await store.deletePrefix(prefix)).toBe(2);
      expect(await store.list(prefix)).toEqual([]);
    });
  });
});

describe('a putBytes failing in the middle of its request', () => {
  it('s3: a PutObject whose connection is cut part-way through its body leaves nothing under the key', async () => {
    const prefix = `checkpoints/${uniqueId('bytes-cut')}/`;
    await behindProxy(async (proxy, store) => {
      let cuts = 0;
      // Every attempt (the SDK retries once) is cut after 3 MiB of its 8 MiB body.
      proxy.hold = ({ method }) =>
        method === 'PUT' ? { afterBytes: 3 * 1024 * 1024, onHeld: () => (cuts += 1), reset: true } : undefined;
      await expect(store.putBytes(`${prefix}a.pack`, randomBytes(8 * 1024 * 1024), {})).rejects.toThrow();
      expect(cuts).toBeGreaterThan(0);
      const client = testS3();
      const objects = await client.send(new ListObjectsV2Command({ Bucket: bucket(), Prefix: prefix }));
      const uploads = await client.send(new ListMultipartUploadsCommand({ Bucket: bucket(), Prefix: prefix }));
      expect({ objects: objects.Contents ?? [], uploads: uploads.Uploads ?? [] }).toEqual({ objects: [], uploads: [] });
    });
  });

  it('s3: a PutObject whose body is damaged on its way is refused by the store (the signed sha-256 is the one putBytes computed)', async () => {
    const prefix = `checkpoints/${uniqueId('bytes-damaged')}/`;
    await behindProxy(async (proxy, store) => {
      const bytes = randomBytes(3 * 1024 * 1024 + 17);
      proxy.corrupt = ({ method }) => method === 'PUT';
      await expect(store.putBytes(`${prefix}a.pack`, bytes, {})).rejects.toThrow(/sha256|SHA256|checksum/i);
      expect(proxy.requests.filter((r) => r.outcome === 'corrupted').length).toBeGreaterThan(0);
      const client = testS3();
      const objects = await client.send(new ListObjectsV2Command({ Bucket: bucket(), Prefix: prefix }));
      expect(objects.Contents ?? []).toEqual([]);
      // Undamaged, the same request goes through.
      proxy.corrupt = undefined;
      const stored = await store.putBytes(`${prefix}a.pack`, bytes, {});
      expect(stored.sha256).toBe(createHash('sha256').update(bytes).digest('hex'));
      expect((await store.read(stored.uri, bytes.length)).equals(bytes)).toBe(true);
      await store.deletePrefix(prefix);
    });
  });

  it('fs: a write failing after the bytes are in place (its labels file cannot be written) leaves the whole bytes, no temporary file', async () => {
    const dir = await tempDir('fs-bytes-fail');
    const store = new FsCheckpointStore(dir);
    const key = `checkpoints/${uniqueId('bytes-fail')}/a.pack`;
    const bytes = randomBytes(4096);
    // A directory where the labels file goes: renaming the written labels file onto it fails.
    await fs.mkdir(path.join(dir, `${key}.labels.json`), { recursive: true });
    await expect(store.putBytes(key, bytes, {})).rejects.toThrow();
    // Nothing removed (the name may be one an earlier checkpoint needs); what is there is whole.
    expect((await fs.readFile(path.join(dir, key))).equals(bytes)).toBe(true);
    expect((await listTree(dir)).filter((p) => p.includes('.tmp-'))).toEqual([]);
  });
});

describe('a PutObject the store refuses before reading its body (503 SlowDown on the headers)', () => {
  // S3 answers an overloaded prefix this way: to a request that asked `Expect: 100-continue` before any
  // body is sent, to one that did not while the body is still on its way (and closes the connection).
  it('s3: putBytes and a multipart put retry or fail with SlowDown, and leave the whole object or nothing', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          // Which PUT requests (in order) are refused early: the SDK tries each request twice.
          refused: fc.uniqueArray(fc.nat({ max: 5 }), { maxLength: 4 }),
          packBytes: fc.constantFrom(1024, 3 * 1024 * 1024 + 5),
          streamBytes: fc.constantFrom(100, 11 * 1024 * 1024),
        }),
        async ({ refused, packBytes, streamBytes }) => {
          const prefix = `checkpoints/${uniqueId('early-503')}/`;
          await behindProxy(
            async (proxy, store) => {
              let puts = 0;
              proxy.early = ({ method }) => method === 'PUT' && refused.includes(puts++);
              const pack = randomBytes(packBytes);
              const stream = randomBytes(streamBytes);
              const attempts = [
                { key: `${prefix}a.pack`, bytes: pack, put: () => store.putBytes(`${prefix}a.pack`, pack, {}) },
                {
                  key: `${prefix}b.tar.gz`,
                  bytes: stream,
                  put: () =>
                    store.put(`${prefix}b.tar.gz`, Readable.from([stream.subarray(0, 7), stream.subarray(7)]), {}),
                },
              ];
              for (const { key, bytes, put } of attempts) {
                const outcome = await put().then(
                  (stored) => stored,
                  (err: unknown) => err as Error,
                );
                const listed = (await store.list(prefix)).filter((o) => o.key === key);
                if (outcome instanceof Error) {
                  // A clear error, and nothing under the key.
                  expect(outcome.message).toMatch(/SlowDown|injected by the fault proxy/);
                  expect(listed).toEqual([]);
                } else {
                  expect(outcome.sha256).toBe(createHash('sha256').update(bytes).digest('hex'));
                  expect((await store.read(outcome.uri, bytes.length)).equals(bytes)).toBe(true);
                }
              }
              const uploads = await testS3().send(
                new ListMultipartUploadsCommand({ Bucket: bucket(), Prefix: prefix }),
              );
              expect(uploads.Uploads ?? []).toEqual([]);
              // The store's early answers did happen, and to bodies the client held back when it asked to.
              const early = proxy.requests.filter((r) => r.outcome === 'early 503');
              expect(early.length).toBe(refused.filter((i) => i < puts).length);
              // Once the store takes them again, the same puts go through whole.
              proxy.early = undefined;
              for (const { bytes, put } of attempts) {
                const stored = await put();
                expect((await store.read(stored.uri, bytes.length)).equals(bytes)).toBe(true);
              }
              await store.deletePrefix(prefix);
            },
            5 * 1024 * 1024,
          );
        },
      ),
      { numRuns: 12 },
    );
  }, 240_000);
});

describe('a read whose answer has no Content-Length', () => {
  it('s3: read holds an answer without a Content-Length to its bound as the bytes arrive', async () => {
    const prefix = `checkpoints/${uniqueId('read-chunked')}/`;
    await behindProxy(async (proxy, store) => {
      const bytes = randomBytes(2 * 1024 * 1024 + 5);
      const stored = await store.putBytes(`${prefix}a.pack`, bytes, {});
      proxy.chunked = ({ method }) => method === 'GET';
      // One byte under the object's size: refused, whether or not the store said how long it is.
      await expect(store.read(stored.uri, bytes.length - 1)).rejects.toThrow(
        `checkpoint object ${stored.uri} is larger than ${bytes.length - 1} bytes`,
      );
      expect((await store.read(stored.uri, bytes.length)).equals(bytes)).toBe(true);
      const gets = proxy.requests.filter((r) => r.method === 'GET');
      expect(gets.length).toBe(2);
      await store.deletePrefix(prefix);
    });
  });
});

describe('createCheckpointStore', () => {
  it('picks s3 when an endpoint is configured and fs under the data dir otherwise', async () => {
    const dataDir = await tempDir('config');
    expect(createCheckpointStore(loadConfig({ STASIS_DATA_DIR: dataDir })).kind).toBe('fs');
    const s3 = createCheckpointStore(
      loadConfig({
        STASIS_DATA_DIR: dataDir,
        STASIS_S3_ENDPOINT: 'http://127.0.0.1:9',
        AWS_ACCESS_KEY_ID: 'a',
        AWS_SECRET_ACCESS_KEY: 'b',
      }),
    );
    expect(s3.kind).toBe('s3');
    const fsStore = createCheckpointStore(loadConfig({ STASIS_DATA_DIR: dataDir }));
    const checkpoint = await fsStore.put('checkpoints/x/1.tar.gz', Readable.from([Buffer.from('x')]), {});
    expect(checkpoint.uri).toBe(`file://${path.join(dataDir, 'checkpoints-store', 'checkpoints', 'x', '1.tar.gz')}`);
  });
});
