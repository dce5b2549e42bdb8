import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

// The search attributes, so operators filter in Temporal Web.
// Their names and types are also registered by the dev server start and compose.
export const StasisKind = defineSearchAttributeKey('StasisKind', SearchAttributeType.KEYWORD);
export const StasisStatus = defineSearchAttributeKey('StasisStatus', SearchAttributeType.KEYWORD);
export const StasisResourceState = defineSearchAttributeKey('StasisResourceState', SearchAttributeType.KEYWORD);
export const StasisPendingInteractions = defineSearchAttributeKey('StasisPendingInteractions', SearchAttributeType.INT);
export const StasisBlockedSince = defineSearchAttributeKey('StasisBlockedSince', SearchAttributeType.DATETIME);
export const StasisProvider = defineSearchAttributeKey('StasisProvider', SearchAttributeType.KEYWORD);
export const StasisHostId = defineSearchAttributeKey('StasisHostId', SearchAttributeType.KEYWORD);
export const StasisParentRunId = defineSearchAttributeKey('StasisParentRunId', SearchAttributeType.KEYWORD);

/** name → Temporal CLI type, for `temporal server start-dev --search-attribute` and compose. */
export const SEARCH_ATTRIBUTE_TYPES: Record<string, 'Keyword' | 'Int' | 'Datetime'> = {
  StasisKind: 'Keyword',
  StasisStatus: 'Keyword',
  StasisResourceState: 'Keyword',
  StasisPendingInteractions: 'Int',
  StasisBlockedSince: 'Datetime',
  StasisProvider: 'Keyword',
  StasisHostId: 'Keyword',
  StasisParentRunId: 'Keyword',
};
