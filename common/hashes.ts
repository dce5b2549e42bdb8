import canonicalize from 'canonicalize';
import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import type { Hashes, RunSpec } from './schemas';

// sha-256 of canonical JSON (RFC 8785). Pure JS so workflows compute the same
// value on every replay and every host.

export function canonicalJson(value: unknown): string {
  return canonicalize(value) ?? 'null';
}

export function sha256Hex(text: string): string {
  return bytesToHex(sha256(new TextEncoder().encode(text)));
}

/** specHash covers the whole spec, policyHash its policy, runHash both with the run's identity. */
export function computeRunHashes(runId: string, spec: RunSpec, parentRunId?: string): Hashes {
  const specHash = sha256Hex(canonicalJson(spec));
  const policyHash = sha256Hex(canonicalJson(spec.policy ?? {}));
  const runHash = sha256Hex(canonicalJson({ runId, parentRunId: parentRunId ?? null, specHash, policyHash }));
  return { run: runHash, spec: specHash, policy: policyHash };
}
