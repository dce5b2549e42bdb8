import * as fc from 'fast-check';
import type { coresdk } from '@temporalio/proto';
import { oneUpsert } from '../../workflows/upsert-merge';

type Command = coresdk.workflow_commands.IWorkflowCommand;

const upsert = (fields: Record<string, string>): Command => ({
  upsertWorkflowSearchAttributes: {
    searchAttributes: {
      indexedFields: Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, { data: Buffer.from(v) }])),
    },
  },
});
const other = (seq: number): Command => ({ startTimer: { seq } });
const command = fc.oneof(
  fc
    .dictionary(fc.constantFrom('StasisStatus', 'StasisResourceState', 'StasisHostId'), fc.string(), { minKeys: 1 })
    .map(upsert),
  fc.nat().map(other),
);

test('an activation’s upserts become one, in the last one’s place, each attribute at its last value; other commands keep their order', () => {
  fc.assert(
    fc.property(fc.array(command, { maxLength: 12 }), (commands) => {
      const merged = oneUpsert(commands);
      const upserts = merged.filter((c) => c.upsertWorkflowSearchAttributes);
      const before = commands.filter((c) => c.upsertWorkflowSearchAttributes);
      expect(upserts).toHaveLength(Math.min(before.length, 1));
      expect(merged.filter((c) => !c.upsertWorkflowSearchAttributes)).toEqual(
        commands.filter((c) => !c.upsertWorkflowSearchAttributes),
      );
      if (before.length === 0) return;
      // In the last upsert's place: the commands after it are the same.
      const lastAt = commands.lastIndexOf(before[before.length - 1]);
      expect(merged.slice(merged.indexOf(upserts[0]) + 1)).toEqual(commands.slice(lastAt + 1));
      const expected: Record<string, unknown> = {};
      for (const c of before)
        Object.assign(expected, c.upsertWorkflowSearchAttributes?.searchAttributes?.indexedFields);
      expect(upserts[0].upsertWorkflowSearchAttributes?.searchAttributes?.indexedFields).toEqual(expected);
    }),
  );
});
