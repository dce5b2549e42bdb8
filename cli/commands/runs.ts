import { readFile } from 'node:fs/promises';
import * as os from 'node:os';
import type { Command } from 'commander';
import { StasisError } from '../../common/errors';
import { parseJsonBytes } from '../../common/utf8';
import { MAX_RUN_LIST_LIMIT, RunStatus, type InteractionResponse } from '../../common/schemas';
import type { CliContext } from '../context';
import { interactionLine, runText, terminalSafe } from '../format';
import { wholeNumber } from '../options';

// `stasis run start|get|list` and `stasis approve`.

/**
 * A RunSpec file, read as REST reads a body (common/wire-json.ts, parseJsonText): UTF-8 only, no byte
 * order mark, JSON, no key twice in one object (JSON.parse kept the last one, where a reader of the
 * file sees the first), no `__proto__` key, well-formed Unicode, bounded nesting. INVALID_ARGUMENT
 * naming the file and what is wrong.
 */
export async function readSpec(file: string): Promise<unknown> {
  let bytes: Buffer;
  try {
    bytes = await readFile(file);
  } catch (err) {
    throw new StasisError('INVALID_ARGUMENT', `spec: cannot read ${file}: ${(err as Error).message}`);
  }
  const parsed = parseJsonBytes(bytes, 'spec');
  if (parsed.problem !== undefined) throw new StasisError('INVALID_ARGUMENT', `${parsed.problem} (in ${file})`);
  return parsed.value;
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
    .option('--limit <n>', `at most n Runs (1-${MAX_RUN_LIST_LIMIT})`, wholeNumber(1, MAX_RUN_LIST_LIMIT), 50)
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
                      `${terminalSafe(r.runId)}  ${r.status}`,
                      ...r.interactions.filter((i) => i.status === 'pending').map((i) => interactionLine(r.runId, i)),
                    ].join('\n')
                  : `${terminalSafe(r.runId)}  ${r.status}`,
              )
              .join('\n');
      ctx.print({ runs }, human);
    });

  program
    .command('approve <runId> <interactionId>')
    .description(
      'answer a pending interaction: approve (default), --deny, --edit-command (approve with an edited command), --option, or --input',
    )
    .option('--deny', 'deny instead of approving')
    .option('--edit-command <command>', 'approve with this command in place of the one under review')
    .option('--option <choice>', "choose one of the interaction's options")
    .option('--comment <text>', 'a comment recorded with the decision')
    .option('--input <text>', 'the answer to an input interaction')
    .action(
      async (
        runId: string,
        interactionId: string,
        opts: { deny?: boolean; editCommand?: string; option?: string; comment?: string; input?: string },
        cmd: Command,
      ) => {
        const ctx = begin(cmd);
        const { response, verb } = answerFromOptions(opts);
        // Who answers is who runs the command, not a name it is given: `--as` would let anyone sign as anyone.
        const respondedBy = os.userInfo().username;
        const answered = await (await ctx.client()).runs.respond(runId, interactionId, response, { respondedBy });
        ctx.print(answered, `${verb} ${interactionId} of ${runId} as ${respondedBy}`);
      },
    );
}

/** The answer the options of `stasis approve` give; at most one kind of answer at a time. */
function answerFromOptions(opts: {
  deny?: boolean;
  editCommand?: string;
  option?: string;
  comment?: string;
  input?: string;
}): {
  response: InteractionResponse;
  verb: string;
} {
  const given = [
    opts.deny ? '--deny' : undefined,
    opts.editCommand !== undefined ? '--edit-command' : undefined,
    opts.option !== undefined ? '--option' : undefined,
    opts.input !== undefined ? '--input' : undefined,
  ].filter((o) => o !== undefined);
  if (given.length > 1) throw new StasisError('INVALID_ARGUMENT', `${given.join(' and ')}: give one kind of answer`);
  const comment = opts.comment !== undefined ? { comment: opts.comment } : {};
  if (opts.input !== undefined) {
    if (opts.comment !== undefined)
      throw new StasisError('INVALID_ARGUMENT', '--input answers an input interaction; it does not go with --comment');
    return { response: { input: opts.input }, verb: 'Answered' };
  }
  if (opts.editCommand !== undefined)
    return {
      response: { decision: 'edit', action: { command: opts.editCommand }, ...comment },
      verb: 'Approved (edited)',
    };
  if (opts.option !== undefined)
    return { response: { option: opts.option, ...comment }, verb: `Chose ${JSON.stringify(opts.option)} for` };
  return opts.deny
    ? { response: { decision: 'deny', ...comment }, verb: 'Denied' }
    : { response: { decision: 'approve', ...comment }, verb: 'Approved' };
}
