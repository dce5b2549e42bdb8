import type { Command } from 'commander';
import { ConfigError } from '../../common/config';
import type { CliContext } from '../context';
import { untilStopSignal } from '../signals';

// `stasis api`: the REST API and approval page on STASIS_HTTP_ADDR (fastify is
// loaded only here, so the one-shot commands start fast).

export function apiCommand(program: Command, begin: (cmd: Command) => CliContext): void {
  program
    .command('api')
    .description('serve the REST API and the approval page on STASIS_HTTP_ADDR')
    .action(async (_opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const config = ctx.config();
      const tokens = config.STASIS_API_TOKENS ?? [];
      if (tokens.length === 0)
        throw new ConfigError([
          'STASIS_API_TOKENS: must be set (name:secret[:role],...): every /api route needs a token',
        ]);
      const { startApi } = await import('../../api/server');
      const { app, url } = await startApi({ client: await ctx.client(), tokens, addr: config.STASIS_HTTP_ADDR });
      ctx.print(
        { apiUrl: `${url}/api/v1`, openApiUrl: `${url}/api/openapi.json`, pageUrl: `${url}/` },
        `stasis api: ${url}/api/v1\n  approval page: ${url}/`,
      );
      await untilStopSignal();
      await app.close();
    });
}
