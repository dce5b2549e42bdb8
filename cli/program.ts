import { Command, CommanderError } from 'commander';
import { ConfigError } from '../common/config';
import { toInternal } from '../common/errors';
import { version } from '../package.json';
import { apiCommand } from './commands/api';
import { devCommand } from './commands/dev';
import { mcpCommand } from './commands/mcp';
import { metricsCommand } from './commands/metrics';
import { runCommands } from './commands/runs';
import { sandboxCommands } from './commands/sandboxes';
import { workerCommand } from './commands/worker';
import { CliContext, type CliIo } from './context';
import { errorText } from './format';

// The `stasis` command line. Exit codes: 0 success (for `sandbox exec`, the
// command's own), 1 a refused or failed operation, 2 a usage or configuration error.

function buildProgram(ctx: CliContext): Command {
  const program = new Command('stasis')
    .description('Durable orchestrator on Temporal for AI-agent Runs and their sandboxes')
    .version(version)
    .option('--json', 'machine-readable output (JSON on stdout)')
    .exitOverride()
    .configureOutput({ writeOut: (s) => ctx.io.stdout.write(s), writeErr: (s) => ctx.io.stderr.write(s) });
  const begin = (cmd: Command): CliContext => {
    ctx.json = Boolean(cmd.optsWithGlobals<{ json?: boolean }>().json);
    return ctx;
  };
  devCommand(program, begin);
  workerCommand(program, begin);
  apiCommand(program, begin);
  runCommands(program, begin);
  sandboxCommands(program, begin);
  metricsCommand(program, begin);
  mcpCommand(program, begin);
  // Subcommands report usage errors through the program's exitOverride and output too.
  for (const cmd of program.commands) cmd.copyInheritedSettings(program);
  return program;
}

function report(ctx: CliContext, err: unknown): number {
  if (err instanceof CommanderError) return err.exitCode === 0 ? 0 : 2;
  if (err instanceof ConfigError) {
    ctx.io.stderr.write(`stasis: configuration error\n${err.problems.map((p) => `  ${p}`).join('\n')}\n`);
    return 2;
  }
  const failure = toInternal(err);
  if (ctx.json)
    ctx.io.stdout.write(`${JSON.stringify({ error: { code: failure.code, message: failure.message } }, null, 2)}\n`);
  else ctx.io.stderr.write(`stasis: ${errorText(failure)}\n`);
  return 1;
}

/** Runs one command line; resolves with the exit code. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  const ctx = new CliContext(io);
  try {
    await buildProgram(ctx).parseAsync(argv, { from: 'user' });
    return ctx.exitCode;
  } catch (err) {
    return report(ctx, err);
  } finally {
    await ctx.close();
  }
}
