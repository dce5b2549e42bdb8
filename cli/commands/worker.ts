import type { Command } from 'commander';
import type { CliContext } from '../context';
import { untilStopSignal } from '../signals';

// `stasis worker`: one host's worker against TEMPORAL_ADDRESS. The worker SDK
// is loaded only here, so the one-shot commands start fast.

export function workerCommand(program: Command, begin: (cmd: Command) => CliContext): void {
  program
    .command('worker')
    .description("run this host's worker (shared task queue and the host's own queue)")
    .action(async (_opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const config = ctx.config();
      const { installWorkerRuntime, serveHostMetrics } = await import('../telemetry');
      const { createStasisWorker } = await import('../../workers/worker');
      const metricsUrl = installWorkerRuntime(config);
      const worker = await createStasisWorker({ config });
      const hostMetrics = await serveHostMetrics(config, worker).catch(async (err: unknown) => {
        await worker.shutdown();
        throw err;
      });
      const running = worker.run();
      const queue = config.STASIS_TASK_QUEUE;
      ctx.print(
        {
          hostId: worker.hostId,
          taskQueues: [queue, `${queue}@${worker.hostId}`],
          workerMetricsUrl: metricsUrl ?? null,
          hostMetricsUrl: hostMetrics?.url ?? null,
        },
        `stasis worker on host ${worker.hostId}: task queues ${queue} and ${queue}@${worker.hostId}` +
          (hostMetrics ? `\n  host metrics: ${hostMetrics.url}` : '') +
          (metricsUrl ? `\n  SDK metrics: ${metricsUrl}` : ''),
      );
      await Promise.race([running, untilStopSignal().then(() => worker.shutdown())]);
      await running;
      await hostMetrics?.close();
    });
}
