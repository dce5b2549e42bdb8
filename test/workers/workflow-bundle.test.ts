import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { TypedSearchAttributes } from '@temporalio/common';
import { ReusableVMWorkflowCreator } from '@temporalio/worker/lib/workflow/reusable-vm';
import type { WorkflowCreateOptions } from '@temporalio/worker/lib/workflow/interface';
import * as ts from 'typescript';
import { workflowBundle } from '../../workers/worker';

// Workflow code runs in one V8 context per Run: whatever the bundle loads, every Run pays for in heap
// and start-up CPU. zod (and the schemas built from it) stays at the edges: API, client, activities.
test('the workflow bundle the worker runs holds neither zod nor the zod schemas', async () => {
  const { code } = await workflowBundle();
  const modules = new Set(code.match(/(?:node_modules\/[^/"' ]+|\.\/[\w-]+\/[\w.-]+\.ts)/g) ?? []);
  // The module names are there to be read: the workflow validators' own module is one of them.
  expect(modules).toContain('./common/wire-checks.ts');
  expect(modules).toContain('node_modules/@temporalio');
  expect([...modules].filter((m) => m === 'node_modules/zod' || m === './common/schemas.ts')).toEqual([]);
});

/** Stasis's own modules in the bundle (`./workflows/x.ts`, `./common/x.ts`). */
async function stasisModules(): Promise<string[]> {
  const { code } = await workflowBundle();
  return [...new Set(code.match(/\.\/(?:workflows|common)\/[\w.-]+\.ts/g) ?? [])].sort();
}

const info = (n: number) => ({
  workflowId: `wf-${n}`,
  runId: `run-${n}`,
  workflowType: 'runWorkflow',
  searchAttributes: {},
  typedSearchAttributes: new TypedSearchAttributes(),
  taskQueue: 'q',
  namespace: 'default',
  firstExecutionRunId: `run-${n}`,
  originalExecutionRunId: `run-${n}`,
  startTime: new Date(0),
  runStartTime: new Date(0),
  taskTimeoutMs: 10_000,
  attempt: 1,
  historyLength: 3,
  historySize: 0,
  continueAsNewSuggested: false,
  targetWorkerDeploymentVersionChanged: false,
  suggestedContinueAsNewReasons: [],
  currentBuildId: '',
  unsafe: { now: () => 0, isReplaying: false, isReplayingHistoryEvents: false, random: () => 0.5 },
  priority: {},
});

// The SDK's reusable V8 context (the worker's default) gives each workflow its own instance of every
// module loaded after the bundle started, unless it was preloaded: Stasis's modules are (workers/worker.ts),
// so a cached Run does not hold its own copy of them (~120 KiB of heap each, BENCHMARKS.md).
test("workflows created in one worker thread share Stasis's modules instead of instantiating them each", async () => {
  const bundle = await workflowBundle();
  const creator = await ReusableVMWorkflowCreator.create(
    {
      code: bundle.code,
      filename: 'stasis-workflows.js',
      sourceMap: { version: 3, file: 'stasis-workflows.js', sources: [], names: [], mappings: '' },
    },
    5_000,
    new Set(['agentStep']),
    undefined,
  );
  try {
    const workflows = [];
    for (const n of [1, 2, 3])
      workflows.push(
        await creator.createWorkflow({
          info: info(n),
          randomnessSeed: [n],
          now: 0,
        } as unknown as WorkflowCreateOptions),
      );
    const own = workflows.map((wf) =>
      [...(wf as unknown as { activator: { moduleCache: Map<string, unknown> } }).activator.moduleCache.keys()].filter(
        (id) => /\.\/(workflows|common)\//.test(id),
      ),
    );
    expect(own).toEqual([[], [], []]);
    // The bundle still holds them: shared, not dropped.
    expect(await stasisModules()).toEqual(expect.arrayContaining(['./workflows/run-workflow.ts']));
    for (const wf of workflows) await wf.dispose();
  } finally {
    await creator.destroy();
  }
});

/**
 * Top-level declarations that would hold state shared by every Run of a worker thread: a `let`/`var`,
 * or a const Map/Set/WeakMap/WeakSet/array buffer (the SDK freezes a shared module's exported objects
 * and arrays, so a write to those throws, but not these).
 */
function moduleState(file: string): string[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022, true);
  const found: string[] = [];
  const mutable = /^new (Map|Set|WeakMap|WeakSet|WeakRef|[A-Za-z0-9]*Array|ArrayBuffer)\b/;
  for (const statement of source.statements) {
    if (!ts.isVariableStatement(statement)) continue;
    const list = statement.declarationList;
    const isConst = (list.flags & ts.NodeFlags.Const) !== 0;
    for (const decl of list.declarations) {
      const init = decl.initializer?.getText(source) ?? '';
      if (!isConst || mutable.test(init)) found.push(`${path.basename(file)}: ${decl.getText(source).slice(0, 80)}`);
    }
  }
  return found;
}

test('the shared workflow modules hold no state of their own (it would be shared by every Run of a thread)', async () => {
  const root = path.join(__dirname, '..', '..');
  const modules = await stasisModules();
  expect(modules.length).toBeGreaterThan(10);
  expect(modules.flatMap((m) => moduleState(path.join(root, m)))).toEqual([]);
  // The check itself finds state where there is some.
  const probe = path.join(mkdtempSync(path.join(os.tmpdir(), 'stasis-module-state-')), 'probe.ts');
  writeFileSync(
    probe,
    'let n = 0;\nconst seen = new Map<string, number>();\nexport const LIMITS = { a: 1 };\nexport const f = () => n++;\n',
  );
  expect(moduleState(probe)).toEqual(['probe.ts: n = 0', 'probe.ts: seen = new Map<string, number>()']);
});
