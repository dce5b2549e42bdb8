import type { Command } from 'commander';
import type { CliContext } from '../context';

// `stasis metrics`: the metrics snapshot (diagnostics).

export function metricsCommand(program: Command, begin: (cmd: Command) => CliContext): void {
  program
    .command('metrics')
    .description('the metrics snapshot: active, retained, pending cleanup, blocked releases, failures, latency')
    .action(async (_opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const m = await (await ctx.client()).metricsSnapshot();
      const l = m.releaseLatencyMs;
      ctx.print(
        m,
        [
          `active                ${m.active}`,
          `retained              ${m.retained}`,
          `pending cleanup       ${m.pendingCleanup}`,
          `release blocked       ${m.releaseBlocked} (oldest ${m.oldestBlockedAgeSeconds} s)`,
          `failures / retries    ${m.failures} / ${m.retries}`,
          `release latency (ms)  p50 ${l.p50}  p95 ${l.p95}  max ${l.max}  (${l.count} releases)`,
        ].join('\n'),
      );
    });
}
