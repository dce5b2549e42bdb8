import { createHash } from 'node:crypto';
import type { Client } from '@temporalio/client';
import { decodeTypedSearchAttributes } from '@temporalio/common/lib/converter/payload-search-attributes';
import { optionalTsToDate } from '@temporalio/common/lib/time';
import { StasisError } from '../common/errors';
import type { SandboxListFilter, SandboxPage, SandboxSummary } from '../common/schemas';
import {
  StasisHostId,
  StasisLabels,
  StasisProvider,
  StasisResourceState,
  StasisStatus,
} from '../workflows/search-attributes';
import { sandboxWorkflowId } from '../workflows/definitions';
import { toStasisError } from './errors';

// Listing sandboxes through visibility (Temporal's list index): one list request
// per page, never a query per sandbox, so a page costs the same for ten sandboxes
// or ten thousand. What it shows is what the sandboxes last published, a moment behind.

const SANDBOX_ID_PREFIX = sandboxWorkflowId('');
const DEFAULT_PAGE_SIZE = 100;

type ListResponse = Awaited<ReturnType<Client['workflowService']['listWorkflowExecutions']>>;
type ExecutionInfo = NonNullable<ListResponse['executions']>[number];
type ParsedFilter = Omit<SandboxListFilter, 'label'> & { label?: (readonly [string, string])[] };

/** The visibility query of a filter; label keys and values are restricted to characters that need no quoting. */
export function sandboxListQuery(filter: Pick<ParsedFilter, 'state' | 'label'>): string {
  return [
    `StasisKind = 'sandbox'`,
    // A continued-as-new run is the same sandbox, already listed by its newest run.
    `ExecutionStatus != 'ContinuedAsNew'`,
    filter.state ? `StasisStatus = '${filter.state}'` : `StasisStatus != 'destroyed'`,
    ...(filter.label ?? []).map(([key, value]) => `StasisLabels = '${key}:${value}'`),
  ].join(' AND ');
}

export async function listSandboxes(client: Client, filter: ParsedFilter): Promise<SandboxPage> {
  const query = sandboxListQuery(filter);
  let response: ListResponse;
  try {
    response = await client.workflowService.listWorkflowExecutions({
      namespace: client.options.namespace,
      query,
      pageSize: filter.pageSize ?? DEFAULT_PAGE_SIZE,
      nextPageToken: filter.nextPageToken ? openToken(filter.nextPageToken, query) : undefined,
    });
  } catch (err) {
    throw toStasisError(err, 'sandboxes');
  }
  const sandboxes = (response.executions ?? []).map(summary);
  const next = response.nextPageToken && response.nextPageToken.length > 0 ? response.nextPageToken : undefined;
  return { sandboxes, ...(next ? { nextPageToken: sealToken(next, query) } : {}) };
}

// A page token is Temporal's, prefixed with a digest of the query it belongs to: a token
// of another list (other filters) or a made-up one is a clear 400, not a server error.
const DIGEST_BYTES = 8;
const digest = (query: string) => createHash('sha256').update(query).digest().subarray(0, DIGEST_BYTES);

function sealToken(token: Uint8Array, query: string): string {
  return Buffer.concat([digest(query), token]).toString('base64url');
}

function openToken(sealed: string, query: string): Buffer {
  const bytes = Buffer.from(sealed, 'base64url');
  if (bytes.length <= DIGEST_BYTES || !bytes.subarray(0, DIGEST_BYTES).equals(digest(query)))
    throw new StasisError(
      'INVALID_ARGUMENT',
      'nextPageToken: not a token of this list (give the same filters as the page it came with)',
    );
  return bytes.subarray(DIGEST_BYTES);
}

function summary(raw: ExecutionInfo): SandboxSummary {
  const attributes = decodeTypedSearchAttributes(raw.searchAttributes?.indexedFields);
  const workflowId = raw.execution?.workflowId ?? '';
  const labels: Record<string, string> = {};
  for (const keyword of attributes.get(StasisLabels) ?? []) {
    const at = keyword.indexOf(':');
    if (at > 0) labels[keyword.slice(0, at)] = keyword.slice(at + 1);
  }
  const hostId = attributes.get(StasisHostId);
  const provider = attributes.get(StasisProvider);
  const resourceState = attributes.get(StasisResourceState);
  return {
    sandboxId: workflowId.startsWith(SANDBOX_ID_PREFIX) ? workflowId.slice(SANDBOX_ID_PREFIX.length) : workflowId,
    state: attributes.get(StasisStatus) ?? 'created',
    ...(provider ? { provider } : {}),
    ...(hostId ? { hostId } : {}),
    ...(resourceState ? { resourceState } : {}),
    labels,
    createdAt: (optionalTsToDate(raw.startTime) ?? new Date(0)).toISOString(),
  };
}
