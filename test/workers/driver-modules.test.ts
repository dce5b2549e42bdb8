import { mkdtempSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../../common/config';
import { createStasisWorker } from '../../workers/worker';
import { runStasis } from '../cli/spawn';
import { startStack } from '../helpers/stack';

// STASIS_DRIVERS: agent-driver modules loaded by path into `stasis worker` / `stasis dev`,
// checked when the worker starts, with an error naming the module at fault.

const dir = mkdtempSync(path.join(os.tmpdir(), 'driver-modules-'));
const moduleFile = (name: string, source: string) => {
  const file = path.join(dir, name);
  writeFileSync(file, source);
  return file;
};
const config = (drivers: string) =>
  loadConfig({
    ...process.env,
    STASIS_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), 'driver-start-')),
    STASIS_TASK_QUEUE: 'never-polled',
    STASIS_DRIVERS: drivers,
  });
const start = (drivers: string) => createStasisWorker({ config: config(drivers) });
const quoted = (file: string) => file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

// Completes with its input after one exec of it: a whole Run through a module's driver.
const ECHO_DRIVER = `
exports.driver = {
  name: 'echo-module',
  async step({ agent, state, lastResult }) {
    if (state === undefined) return { action: { type: 'job', command: 'printf %s ' + JSON.stringify(agent.input) }, state: 1 };
    return { action: { type: 'complete', output: { echoed: lastResult.stdout } }, state: 2 };
  },
};`;

test('a missing driver module stops the worker start, naming the file', async () => {
  const missing = path.join(dir, 'nowhere.js');
  await expect(start(missing)).rejects.toThrow(new RegExp(`driver module ${quoted(missing)}.*does not exist`));
});

test('a module exporting no driver, or not a valid one, stops the start, naming the module and what is wrong', async () => {
  const none = moduleFile('none.js', 'exports.somethingElse = 1;');
  await expect(start(none)).rejects.toThrow(new RegExp(`driver module ${quoted(none)} exports neither`));
  const noStep = moduleFile('no-step.js', "exports.driver = { name: 'half' };");
  await expect(start(noStep)).rejects.toThrow(
    new RegExp(`driver module ${quoted(noStep)} is not a valid agent driver: .step`),
  );
  const noName = moduleFile('no-name.js', 'exports.default = { name: "", async step() {} };');
  await expect(start(noName)).rejects.toThrow(
    new RegExp(`driver module ${quoted(noName)} is not a valid agent driver: .name`),
  );
  const notObject = moduleFile('string.js', 'exports.default = "scripted";');
  await expect(start(notObject)).rejects.toThrow(
    new RegExp(`${quoted(notObject)} is not a valid agent driver: its export is a string`),
  );
  const throws = moduleFile('throws.js', 'throw new Error("boom at load");');
  await expect(start(throws)).rejects.toThrow(
    new RegExp(`driver module ${quoted(throws)} failed to load: boom at load`),
  );
});

test('two drivers of one name, or a module claiming the built-in scripted, stop the start, naming the module', async () => {
  const first = moduleFile('first.js', ECHO_DRIVER);
  const second = moduleFile('second.js', ECHO_DRIVER.replace('exports.driver', 'exports.default'));
  await expect(start(`${first},${second}`)).rejects.toThrow(
    new RegExp(`"echo-module" \\(driver module ${quoted(second)}\\) is registered twice`),
  );
  const impostor = moduleFile('impostor.js', "exports.driver = { name: 'scripted', async step() {} };");
  await expect(start(impostor)).rejects.toThrow(
    new RegExp(`"scripted" \\(driver module ${quoted(impostor)}\\) is registered twice`),
  );
});

test('`stasis worker` with a bad STASIS_DRIVERS exits non-zero with the module in its error', async () => {
  const noStep = moduleFile('cli-no-step.js', "module.exports = { driver: { name: 'x' } };");
  const { STASIS_API_TOKENS: _none, ...env } = process.env;
  const result = await runStasis(['worker'], {
    ...env,
    STASIS_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), 'driver-cli-')),
    STASIS_TASK_QUEUE: 'never-polled',
    STASIS_DRIVERS: noStep,
    STASIS_WORKER_METRICS_ADDR: 'off',
    STASIS_METRICS_ADDR: 'off',
  });
  expect(result.code).not.toBe(0);
  expect(result.stderr).toContain(`driver module ${noStep} is not a valid agent driver`);
});

test('a Run completes through a driver loaded from STASIS_DRIVERS', async () => {
  const stack = await startStack({ env: { STASIS_DRIVERS: moduleFile('echo.js', ECHO_DRIVER) } });
  try {
    const { runId } = await stack.client.runs.start({
      agent: { driver: 'echo-module', input: 'from the module' },
      sandbox: { provider: 'local' },
    });
    await expect(stack.temporal.workflow.getHandle(runId).result()).resolves.toEqual({ echoed: 'from the module' });
  } finally {
    await stack.stop();
  }
});
