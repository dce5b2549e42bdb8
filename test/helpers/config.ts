import { ConfigError, loadConfig } from '../../common/config';

/** The problem lines loadConfig reports for `env` (none when it loads); any other error is thrown. */
export function configProblems(env: NodeJS.ProcessEnv): string[] {
  try {
    loadConfig(env);
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  return [];
}
