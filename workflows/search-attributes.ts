import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

// The search attributes, so operators filter in Temporal Web. The dev server start
// registers them from SEARCH_ATTRIBUTE_TYPES; docker-compose.temporal.yml and README
// list them by hand, and test/unit/deployment.test.ts holds those lists equal to this one.
export const StasisKind = defineSearchAttributeKey('StasisKind', SearchAttributeType.KEYWORD);
export const StasisStatus = defineSearchAttributeKey('StasisStatus', SearchAttributeType.KEYWORD);
export const StasisResourceState = defineSearchAttributeKey('StasisResourceState', SearchAttributeType.KEYWORD);
export const StasisPendingInteractions = defineSearchAttributeKey('StasisPendingInteractions', SearchAttributeType.INT);
export const StasisBlockedSince = defineSearchAttributeKey('StasisBlockedSince', SearchAttributeType.DATETIME);
export const StasisProvider = defineSearchAttributeKey('StasisProvider', SearchAttributeType.KEYWORD);
export const StasisHostId = defineSearchAttributeKey('StasisHostId', SearchAttributeType.KEYWORD);
export const StasisParentRunId = defineSearchAttributeKey('StasisParentRunId', SearchAttributeType.KEYWORD);
/** A Run's or sandbox's labels, each as `key:value`: `StasisLabels = 'team:infra'` finds them. */
export const StasisLabels = defineSearchAttributeKey('StasisLabels', SearchAttributeType.KEYWORD_LIST);

/** Every Stasis search attribute. */
export const SEARCH_ATTRIBUTE_KEYS = [
  StasisKind,
  StasisStatus,
  StasisResourceState,
  StasisPendingInteractions,
  StasisBlockedSince,
  StasisProvider,
  StasisHostId,
  StasisParentRunId,
  StasisLabels,
];

/** The Temporal CLI's name of each type (`--search-attribute Name=Type`, `--type Type`). */
const CLI_TYPE: Record<SearchAttributeType, string> = {
  [SearchAttributeType.TEXT]: 'Text',
  [SearchAttributeType.KEYWORD]: 'Keyword',
  [SearchAttributeType.INT]: 'Int',
  [SearchAttributeType.DOUBLE]: 'Double',
  [SearchAttributeType.BOOL]: 'Bool',
  [SearchAttributeType.DATETIME]: 'Datetime',
  [SearchAttributeType.KEYWORD_LIST]: 'KeywordList',
};

/** name → Temporal CLI type, for `temporal server start-dev --search-attribute` and compose. */
export const SEARCH_ATTRIBUTE_TYPES: Record<string, string> = Object.fromEntries(
  SEARCH_ATTRIBUTE_KEYS.map((key) => [key.name, CLI_TYPE[key.type]]),
);
