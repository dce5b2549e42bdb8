import type { Command } from 'commander';
import { ConfigError } from '../../common/config';
import type { CliContext } from '../context';
import { untilStopSignal } from '../signals';

// `stasis mcp`: the MCP server on stdin/stdout. It acts through the REST API
// (STASIS_API_URL) with one token (STASIS_API_TOKEN), so the agent has that
// token's role and answers are recorded under its name. stdout carries only
// protocol messages; it stops when the client closes stdin or on a signal.

export function mcpCommand(program: Command, begin: (cmd: Command) => CliContext): void {
  program
    .command('mcp')
    .description('serve the Stasis MCP tools over stdio, acting through the REST API with STASIS_API_TOKEN')
    .action(async (_opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const { STASIS_API_URL: url, STASIS_API_TOKEN: token } = ctx.config();
      if (!url || !token)
        throw new ConfigError(
          Object.entries({ STASIS_API_URL: url, STASIS_API_TOKEN: token })
            .filter(([, value]) => !value)
            .map(([name]) => `${name}: must be set: stasis mcp acts through the REST API with one of its tokens`),
        );
      const { StdioServerTransport } = await import('@modelcontextprotocol/sdk/server/stdio.js');
      const { ApiClient } = await import('../../mcp/api-client');
      const { createMcpServer } = await import('../../mcp/server');
      const api = new ApiClient({ url, token });
      // Who the token is decides which tools are offered; a wrong token stops here (401).
      const server = createMcpServer(api, await api.me());
      await server.connect(new StdioServerTransport());
      await Promise.race([new Promise((resolve) => process.stdin.once('end', resolve)), untilStopSignal()]);
      await server.close();
    });
}
