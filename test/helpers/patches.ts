import { Client, Connection } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import type { Config } from '../../common/config';

/** The patch ids of a history's patch markers (`core_patch`), in order. */
export function patchIds(events: temporal.api.history.v1.IHistoryEvent[]): string[] {
  return events.flatMap((e) => {
    const marker = e.markerRecordedEventAttributes;
    if (marker?.markerName !== 'core_patch') return [];
    const data = marker.details?.['patch-data']?.payloads?.[0]?.data;
    return data ? [(JSON.parse(Buffer.from(data).toString('utf8')) as { id: string }).id] : [];
  });
}

/**
 * The events of every execution of `workflowId` (each continue-as-new starts one), oldest first.
 * Read over a connection that takes histories past gRPC's default 4 MB message (a Run with large
 * payloads has them).
 */
export async function historiesOfEveryExecution(
  config: Config,
  workflowId: string,
): Promise<temporal.api.history.v1.IHistoryEvent[][]> {
  const connection = await Connection.connect({
    ...config.temporal.connectionOptions,
    channelArgs: { 'grpc.max_receive_message_length': 256 * 1024 * 1024 },
  });
  try {
    const client = new Client({ connection, namespace: config.TEMPORAL_NAMESPACE });
    const executions: { runId: string; startMs: number }[] = [];
    for await (const e of client.workflow.list({ query: `WorkflowId = '${workflowId}'` })) {
      executions.push({ runId: e.runId, startMs: e.startTime.getTime() });
    }
    executions.sort((a, b) => a.startMs - b.startMs);
    const out: temporal.api.history.v1.IHistoryEvent[][] = [];
    for (const { runId } of executions) {
      out.push((await client.workflow.getHandle(workflowId, runId).fetchHistory()).events ?? []);
    }
    return out;
  } finally {
    await connection.close();
  }
}

/** The patch ids of every execution of `workflowId`, oldest first (historiesOfEveryExecution). */
export async function patchIdsOfEveryExecution(config: Config, workflowId: string): Promise<string[][]> {
  return (await historiesOfEveryExecution(config, workflowId)).map(patchIds);
}
