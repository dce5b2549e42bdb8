import type { Command } from 'commander';
import type { CliContext } from '../context';
import { untilStopSignal } from '../signals';

// `stasis mcp`: the MCP server on stdin/stdout. stdout carries only protocol
// messages; it stops when the client closes stdin or on a signal.

export function mcpCommand(program: Command, begin: (cmd: Command) => CliContext): void {
  program
    .command('mcp')
    .description('serve the Stasis MCP tools over stdio')
    .option('--as <name>', 'recorded as respondedBy for interaction_respond', 'mcp')
    .action(async (opts: { as: string }, cmd: Command) => {
      const ctx = begin(cmd);
      const { StdioServerTransport } = await import('@modelcontextprotocol/sdk/server/stdio.js');
      const { createMcpServer } = await import('../../mcp/server');
      const server = createMcpServer(await ctx.client(), { respondedBy: opts.as });
      await server.connect(new StdioServerTransport());
      await Promise.race([new Promise((resolve) => process.stdin.once('end', resolve)), untilStopSignal()]);
      await server.close();
    });
}
