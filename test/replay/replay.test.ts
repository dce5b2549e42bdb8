import { readdirSync, readFileSync } from 'node:fs';
import * as path from 'node:path';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import { Worker } from '@temporalio/worker';
import { workflowBundle } from '../../workers/worker';

// Every recorded history of a released workflow version must replay against the
// current workflow code: a change that breaks determinism fails here, in CI.
const dir = path.join(__dirname, '..', 'histories');
// Files are `<workflowId>__<runId>.json`: the workflow id is part of what a Run computes.
const recorded = readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .map((file) => {
    const json = JSON.parse(readFileSync(path.join(dir, file), 'utf8')) as {
      events: { workflowExecutionStartedEventAttributes?: { workflowType?: { name?: string } } }[];
    };
    return {
      file,
      workflowId: file.split('__')[0],
      type: json.events[0].workflowExecutionStartedEventAttributes?.workflowType?.name,
      json,
    };
  });

test('there are recorded histories of runWorkflow and sandboxWorkflow', () => {
  expect(recorded.some((h) => h.type === 'runWorkflow')).toBe(true);
  expect(recorded.some((h) => h.type === 'sandboxWorkflow')).toBe(true);
});

test(`all ${recorded.length} recorded histories replay without nondeterminism`, async () => {
  const histories = recorded.map((h) => ({ workflowId: h.workflowId, history: historyFromJSON(h.json) }));
  const failures: string[] = [];
  for await (const result of Worker.runReplayHistories({ workflowBundle: await workflowBundle() }, histories)) {
    if (result.error) failures.push(`${result.workflowId}: ${result.error.message}`);
  }
  expect(failures).toEqual([]);
});
