import type { Client, Workflow, WorkflowExecutionDescription, WorkflowHandle } from '@temporalio/client';
import { StasisError } from '../common/errors';
import { toStasisError } from './errors';

// Deployments that share a Temporal namespace each have their own task queue (STASIS_TASK_QUEUE), and
// a client acts only on the Runs and sandboxes of its own: a workflow id of another queue is NOT_FOUND,
// as an unknown id is, and nothing (no query, Update, signal, cancel) reaches it.
//
// The check is one DescribeWorkflowExecution (its task queue and workflow type). Reads describe every
// time (a query names only the workflow id, so it follows the id to whatever workflow holds it now);
// a Run's get needed that describe anyway, to see whether Temporal closed its workflow. Updates and
// cancels are bound to the chain the describe saw (its first run id, which continue-as-new keeps):
// Temporal applies them only to that chain, so an id whose chain is gone (its workflow deleted after
// the namespace's retention, and the id started again elsewhere) is refused by Temporal itself. That
// makes it safe to remember the chains seen, so an Update (an answer, an action, an exec, a file) to
// an id already checked costs nothing more: a bounded map, the oldest forgotten first.

/** How many checked ids a client remembers (about 100 bytes each). */
export const OWNED_IDS_REMEMBERED = 10_000;

/** A workflow checked to be ours, and the chain its Updates and cancels are bound to. */
export interface OwnedWorkflow<W extends Workflow> {
  /** For Updates and cancel: bound to the chain the check saw (its first run id). */
  handle: WorkflowHandle<W>;
  /** What the check's describe answered (its status: RUNNING, COMPLETED, TERMINATED, …). */
  description: WorkflowExecutionDescription;
}

/**
 * The workflows of one task queue and type that a client may act on. `what(id)` names an id in a
 * refusal, as toStasisError does (`run <id>`, `sandbox <id>`): a foreign one is `<what> not found`.
 */
export class OwnedWorkflows {
  /** workflow id → first run id of the chain checked ('' when the server gave none). Oldest first. */
  private readonly chains = new Map<string, string>();

  constructor(
    private readonly taskQueue: string,
    private readonly workflowType: string,
    private readonly max: number = OWNED_IDS_REMEMBERED,
  ) {}

  /** The described workflow, checked: NOT_FOUND (as an unknown id) when it is of another queue or type. */
  async describe<W extends Workflow>(client: Client, workflowId: string, what: string): Promise<OwnedWorkflow<W>> {
    let description: WorkflowExecutionDescription;
    try {
      description = await client.workflow.getHandle(workflowId).describe();
    } catch (err) {
      throw toStasisError(err, what);
    }
    if (description.taskQueue !== this.taskQueue || description.type !== this.workflowType) {
      this.chains.delete(workflowId);
      throw new StasisError('NOT_FOUND', `${what} not found`);
    }
    const first = description.raw.workflowExecutionInfo?.firstRunId ?? '';
    this.remember(workflowId, first);
    return { handle: this.bound<W>(client, workflowId, first), description };
  }

  /** For an Update or a cancel: the remembered chain, or one describe. */
  async forUpdate<W extends Workflow>(client: Client, workflowId: string, what: string): Promise<WorkflowHandle<W>> {
    const first = this.chains.get(workflowId);
    if (first !== undefined) return this.bound<W>(client, workflowId, first);
    return (await this.describe<W>(client, workflowId, what)).handle;
  }

  /** A workflow this client started: its chain is ours. */
  remember(workflowId: string, firstRunId: string): void {
    this.chains.delete(workflowId);
    this.chains.set(workflowId, firstRunId);
    if (this.chains.size > this.max) this.chains.delete(this.chains.keys().next().value as string);
  }

  /** Forgets `workflowId` (Temporal no longer has its chain): the next call describes it again. */
  forget(workflowId: string): void {
    this.chains.delete(workflowId);
  }

  /** How many ids are remembered (tests). */
  get size(): number {
    return this.chains.size;
  }

  private bound<W extends Workflow>(client: Client, workflowId: string, first: string): WorkflowHandle<W> {
    return client.workflow.getHandle<W>(workflowId, undefined, first ? { firstExecutionRunId: first } : undefined);
  }
}
