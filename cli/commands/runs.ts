import { readFile } from 'node:fs/promises';
import * as os from 'node:os';
import type { Command } from 'commander';
import { StasisError } from '../../common/errors';
import { RunStatus } from '../../common/schemas';
import type { CliContext } from '../context';
import { interactionLine, runText } from '../format';

// `stasis run start|get|list` and `stasis approve`.

async function readSpec(file: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new StasisError('INVALID_ARGUMENT', `spec: cannot read ${file}: ${(err as Error).message}`);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new StasisError('INVALID_ARGUMENT', `spec: ${file} is not JSON: ${(err as Error).message}`);
  }
}

export function runCommands(program: Command, begin: (cmd: Command) => CliContext): void {
  const run = program.command('run').description('start, inspect and list Runs');

  run
    .command('start <spec.json>')
    .description('start a Run from a RunSpec JSON file')
    .action(async (file: string, _opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const spec = await readSpec(file);
      const { runId } = await (await ctx.client()).runs.start(spec);
      ctx.print({ runId }, `Started run ${runId}\n  follow it: stasis run get ${runId}`);
    });

  run
    .command('get <runId>')
    .description("a Run's status, interactions and output")
    .action(async (runId: string, _opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const snapshot = await (await ctx.client()).runs.get(runId);
      ctx.print(snapshot, runText(snapshot));
    });

  run
    .command('list')
    .description('Runs, newest first')
    .option('--waiting', 'only Runs waiting on a person, with their pending interactions')
    .option('--status <status>', `only Runs with this status (${RunStatus.options.join(', ')})`)
    .option('--limit <n>', 'at most n Runs', (v) => Number.parseInt(v, 10), 50)
    .action(async (opts: { waiting?: boolean; status?: string; limit: number }, cmd: Command) => {
      const ctx = begin(cmd);
      const status = opts.waiting ? 'WAITING' : opts.status;
      const parsed = RunStatus.optional().safeParse(status);
      if (!parsed.success)
        throw new StasisError('INVALID_ARGUMENT', `--status: must be one of ${RunStatus.options.join(', ')}`);
      const runs = await (await ctx.client()).runs.list({ status: parsed.data, limit: opts.limit });
      const human =
        runs.length === 0
          ? opts.waiting
            ? 'Nothing is waiting on a person.'
            : 'No runs.'
          : runs
              .map((r) =>
                opts.waiting
                  ? [
                      `${r.runId}  ${r.status}`,
                      ...r.interactions.filter((i) => i.status === 'pending').map((i) => interactionLine(r.runId, i)),
                    ].join('\n')
                  : `${r.runId}  ${r.status}`,
              )
              .join('\n');
      ctx.print({ runs }, human);
    });

  program
    .command('approve <runId> <interactionId>')
    .description('answer a pending interaction: approve (default), --deny, or --input for input interactions')
    .option('--deny', 'deny instead of approving')
    .option('--comment <text>', 'a comment recorded with the decision')
    .option('--input <text>', 'the answer to an input interaction')
    .action(
      async (
        runId: string,
        interactionId: string,
        opts: { deny?: boolean; comment?: string; input?: string },
        cmd: Command,
      ) => {
        const ctx = begin(cmd);
        if (opts.input !== undefined && (opts.deny || opts.comment !== undefined)) {
          throw new StasisError(
            'INVALID_ARGUMENT',
            '--input answers an input interaction; it does not go with --deny or --comment',
          );
        }
        const response =
          opts.input !== undefined
            ? { input: opts.input }
            : {
                decision: opts.deny ? ('deny' as const) : ('approve' as const),
                ...(opts.comment !== undefined ? { comment: opts.comment } : {}),
              };
        // Who answers is who runs the command, not a name it is given: `--as` would let anyone sign as anyone.
        const respondedBy = os.userInfo().username;
        const answered = await (await ctx.client()).runs.respond(runId, interactionId, response, { respondedBy });
        const verb = opts.input !== undefined ? 'Answered' : opts.deny ? 'Denied' : 'Approved';
        ctx.print(answered, `${verb} ${interactionId} of ${runId} as ${respondedBy}`);
      },
    );
}
