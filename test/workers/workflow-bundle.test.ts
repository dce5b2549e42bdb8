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
