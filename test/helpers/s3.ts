import {
  CopyObjectCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
} from '@aws-sdk/client-s3';

/** A plain S3 client on the test MinIO, to look at what Stasis stored. */
export function testS3(): S3Client {
  return new S3Client({
    endpoint: process.env.STASIS_S3_ENDPOINT,
    region: process.env.STASIS_S3_REGION ?? 'us-east-1',
    forcePathStyle: true,
    credentials: {
      accessKeyId: process.env.AWS_ACCESS_KEY_ID ?? '',
      secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY ?? '',
    },
  });
}

/** Every key under `checkpoints/<sandboxId>/`: checkpoints, the packs of their chunks and their manifests' segments. */
export async function storedKeys(s3: S3Client, sandboxId: string): Promise<string[]> {
  const out = await s3.send(
    new ListObjectsV2Command({ Bucket: process.env.STASIS_S3_BUCKET, Prefix: `checkpoints/${sandboxId}/` }),
  );
  return (out.Contents ?? []).map((o) => o.Key ?? '');
}

/**
 * The keys of the sandbox's checkpoints, one per checkpoint: a content-addressed
 * checkpoint's manifest or an earlier version's tar.gz (not the packs and manifest segments they share).
 */
export async function checkpointKeys(s3: S3Client, sandboxId: string): Promise<string[]> {
  return (await storedKeys(s3, sandboxId)).filter(
    (key) =>
      !key.startsWith(`checkpoints/${sandboxId}/packs/`) && !key.startsWith(`checkpoints/${sandboxId}/segments/`),
  );
}

/**
 * Takes the object at `key` away from the test bucket (copied to `aside/<key>`, then deleted), as
 * if the store had lost it; the returned function puts it back where it was.
 */
export async function moveAside(s3: S3Client, key: string): Promise<() => Promise<void>> {
  const bucket = process.env.STASIS_S3_BUCKET;
  const aside = `aside/${key}`;
  await s3.send(new CopyObjectCommand({ Bucket: bucket, CopySource: `${bucket}/${key}`, Key: aside }));
  await s3.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
  return async () => {
    await s3.send(new CopyObjectCommand({ Bucket: bucket, CopySource: `${bucket}/${aside}`, Key: key }));
    await s3.send(new DeleteObjectCommand({ Bucket: bucket, Key: aside }));
  };
}

/** A stored object by its `s3://` uri, read and replaced behind the store's back (as corruption would). */
export function storedObject(uri: string): {
  key: string;
  read(): Promise<Buffer>;
  write(body: Buffer): Promise<void>;
} {
  const s3 = testS3();
  const bucket = process.env.STASIS_S3_BUCKET ?? 'stasis';
  const key = uri.replace(/^s3:\/\/[^/]+\//, '');
  return {
    key,
    async read() {
      const got = await s3.send(new GetObjectCommand({ Bucket: bucket, Key: key }));
      return Buffer.from(await got.Body!.transformToByteArray());
    },
    async write(body) {
      await s3.send(new PutObjectCommand({ Bucket: bucket, Key: key, Body: body }));
    },
  };
}
