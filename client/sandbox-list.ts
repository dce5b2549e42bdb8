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

/**
 * The visibility query of a filter on the sandboxes of `taskQueue` (as a Run list is: another deployment
 * in the namespace, on its own queue, has its own); label keys and values, and queue names
 * (QUEUE_NAME), are restricted to characters that need no quoting. Every state but `destroyed` lists
 * only sandboxes whose workflow runs: one whose workflow ended otherwise (its provisioning failed, it
 * was terminated in Temporal) is gone, as get and destroy say (NOT_FOUND), and shows in no list.
 */
export function sandboxListQuery(taskQueue: string, filter: Pick<ParsedFilter, 'state' | 'label'>): string {
  return [
    `StasisKind = 'sandbox'`,
    `TaskQueue = '${taskQueue}'`,
    ...(filter.state === 'destroyed'
      ? // A continued-as-new run is the same sandbox, listed by its newest run.
        [`ExecutionStatus != 'ContinuedAsNew'`, `StasisStatus = 'destroyed'`]
      : [
          `ExecutionStatus = 'Running'`,
          filter.state ? `StasisStatus = '${filter.state}'` : `StasisStatus != 'destroyed'`,
        ]),
    ...(filter.label ?? []).map(([key, value]) => `StasisLabels = '${key}:${value}'`),
  ].join(' AND ');
}

export async function listSandboxes(client: Client, taskQueue: string, filter: ParsedFilter): Promise<SandboxPage> {
  const query = sandboxListQuery(taskQueue, filter);
  let response: ListResponse;
  try {
    response = await client.workflowService.listWorkflowExecutions({
      namespace: client.options.namespace,
      query,
      pageSize: filter.pageSize ?? DEFAULT_PAGE_SIZE,
      nextPageToken: filter.nextPageToken ? openToken(filter.nextPageToken, query) : undefined,
    });
  } catch (err) {
    if (filter.nextPageToken && (await listsWithoutToken(client, query)))
      throw new StasisError('INVALID_ARGUMENT', NOT_THIS_LIST);
    throw toStasisError(err, 'sandboxes');
  }
  const sandboxes = (response.executions ?? []).map(summary);
  const next = response.nextPageToken && response.nextPageToken.length > 0 ? response.nextPageToken : undefined;
  return { sandboxes, ...(next ? { nextPageToken: sealToken(next, query) } : {}) };
}

// A page token is Temporal's, sealed with a digest of the query it belongs to and of the
// token itself: a token of another list (other filters), a made-up one, or one damaged on
// the way (cut short, bytes added or changed) is a clear 400 before Temporal sees it, not a
// server error. The digest holds no secret: it catches mistakes, and the token stays opaque.
const DIGEST_BYTES = 16;
const NOT_THIS_LIST =
  'nextPageToken: not a token of this list, or damaged (give it whole, with the same filters as the page it came with)';

const digest = (query: string, token: Uint8Array) =>
  createHash('sha256').update(query).update('\0').update(token).digest().subarray(0, DIGEST_BYTES);

/**
 * Whether the list of `query` is served without a page token: if so, a page that failed with one failed
 * for its token. A token can pass the seal yet not be Temporal's (the seal holds no secret: a forged
 * one), and Temporal answers such a token with UNKNOWN ("something went wrong"), not a refusal, which
 * the connection retries for ~20 s first: slow, but only for a forged token, and a clear 400 at the end.
 */
async function listsWithoutToken(client: Client, query: string): Promise<boolean> {
  try {
    await client.workflowService.listWorkflowExecutions({ namespace: client.options.namespace, query, pageSize: 1 });
    return true;
  } catch {
    return false;
  }
}

/** Temporal's page token, sealed for the list of `query`. */
export function sealToken(token: Uint8Array, query: string): string {
  return Buffer.concat([digest(query, token), token]).toString('base64url');
}

/** Temporal's page token inside `sealed`; INVALID_ARGUMENT unless it is whole and of this list. */
export function openToken(sealed: string, query: string): Buffer {
  const bytes = Buffer.from(sealed, 'base64url');
  const token = bytes.subarray(DIGEST_BYTES);
  // Base64url decoding skips stray characters; only the one spelling of these bytes is the token.
  const whole = bytes.toString('base64url') === sealed && token.length > 0;
  if (!whole || !bytes.subarray(0, DIGEST_BYTES).equals(digest(query, token)))
    throw new StasisError('INVALID_ARGUMENT', NOT_THIS_LIST);
  return token;
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
