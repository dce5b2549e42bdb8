import { existsSync } from 'node:fs';
import * as path from 'node:path';
import { StasisError } from '../common/errors';
import type { AgentDriver } from '../drivers/api';
import { scriptedDriver } from '../drivers/scripted';

// The agent drivers a worker serves, by name: the built-in `scripted`, the ones
// given in code, and the modules of STASIS_DRIVERS. All are checked when the
// worker starts, so a bad module stops the start with its path instead of failing
// the first Run that uses it.

/**
 * An agent-driver module exports the driver as `default` or `driver`
 * (`module.exports = { driver }`, or `export default driver` compiled to CommonJS).
 */
export type DriverModule = { default?: AgentDriver; driver?: AgentDriver };

/** The drivers by name; throws a StasisError naming the module or driver at fault. */
export function loadDrivers(given: readonly AgentDriver[], modulePaths: readonly string[]): Map<string, AgentDriver> {
  const drivers = new Map<string, AgentDriver>();
  const add = (candidate: unknown, origin: string) => {
    const driver = validateDriver(candidate, origin);
    const earlier = drivers.get(driver.name);
    if (earlier) {
      throw new StasisError(
        'INVALID_ARGUMENT',
        `agent driver ${JSON.stringify(driver.name)} (${origin}) is registered twice: a driver of that name is already loaded`,
      );
    }
    drivers.set(driver.name, driver);
  };
  add(scriptedDriver, 'built-in scripted');
  for (const driver of given) add(driver, 'given in code');
  for (const modulePath of modulePaths) add(loadDriverModule(modulePath), `driver module ${path.resolve(modulePath)}`);
  return drivers;
}

/** Splits a comma-separated STASIS_DRIVERS / STASIS_PROVIDERS value. */
export function modulePathList(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean);
}

function loadDriverModule(modulePath: string): unknown {
  const resolved = path.resolve(modulePath);
  if (!existsSync(resolved)) {
    throw new StasisError('INVALID_ARGUMENT', `driver module ${resolved} (STASIS_DRIVERS) does not exist`);
  }
  let loaded: unknown;
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- driver modules are chosen at run time
    loaded = require(resolved);
  } catch (err) {
    throw new StasisError('INVALID_ARGUMENT', `driver module ${resolved} failed to load: ${(err as Error).message}`);
  }
  const module = typeof loaded === 'object' && loaded !== null ? (loaded as Record<string, unknown>) : {};
  const exported = module.default ?? module.driver;
  if (exported === undefined) {
    throw new StasisError('INVALID_ARGUMENT', `driver module ${resolved} exports neither \`default\` nor \`driver\``);
  }
  return exported;
}

function validateDriver(candidate: unknown, origin: string): AgentDriver {
  const record =
    typeof candidate === 'object' && candidate !== null ? (candidate as Record<string, unknown>) : undefined;
  const problems: string[] = [];
  if (!record) problems.push(`its export is ${candidate === null ? 'null' : `a ${typeof candidate}`}, not an object`);
  else {
    if (typeof record.name !== 'string' || record.name.length === 0) problems.push('`name` must be a non-empty string');
    if (typeof record.step !== 'function') problems.push('`step` must be a function');
  }
  if (problems.length > 0) {
    throw new StasisError('INVALID_ARGUMENT', `${origin} is not a valid agent driver: ${problems.join('; ')}`);
  }
  // Checked above; the object itself is kept so `step` keeps its `this`.
  return candidate as AgentDriver;
}
