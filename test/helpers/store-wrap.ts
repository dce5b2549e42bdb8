import type { CheckpointStore } from '../../stores/api';

/**
 * Every call of `inner`, passed through as own properties: spread it into a store and override
 * what the test breaks, holds or watches (its put or putBytes, mostly).
 */
export function passThrough(inner: CheckpointStore): CheckpointStore {
  return {
    kind: inner.kind,
    put: (key, body, labels, signal) => inner.put(key, body, labels, signal),
    putBytes: (key, bytes, labels, signal, sha256) => inner.putBytes(key, bytes, labels, signal, sha256),
    download: (checkpoint, file, signal, verify) => inner.download(checkpoint, file, signal, verify),
    delete: (uri) => inner.delete(uri),
    uriOf: (key) => inner.uriOf(key),
    exists: (uri) => inner.exists(uri),
    deletePrefix: (prefix) => inner.deletePrefix(prefix),
    list: (prefix) => inner.list(prefix),
    read: (uri, maxBytes, signal) => inner.read(uri, maxBytes, signal),
  };
}
