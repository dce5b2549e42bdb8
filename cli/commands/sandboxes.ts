import type { Command } from 'commander';
import { StasisError } from '../../common/errors';
import { MAX_PAGE_SIZE, type CreateSandboxInput, type SandboxState } from '../../common/schemas';
import type { CliContext } from '../context';
import { bytes, sandboxListText, sandboxText } from '../format';
import { wholeNumber } from '../options';
import { withProgress } from '../progress';

// `stasis sandbox create|list|get|exec|suspend|resume|destroy`.

const collect = (value: string, previous: string[]): string[] => [...previous, value];

function envPairs(pairs: string[]): Record<string, string> | undefined {
  if (pairs.length === 0) return undefined;
  return Object.fromEntries(
    pairs.map((pair) => {
      const at = pair.indexOf('=');
      if (at < 1) throw new StasisError('INVALID_ARGUMENT', `--env: ${JSON.stringify(pair)} must be NAME=value`);
      return [pair.slice(0, at), pair.slice(at + 1)];
    }),
  );
}

function labelPairs(pairs: string[]): Record<string, string> {
  return Object.fromEntries(
    pairs.map((pair) => {
      const at = pair.indexOf(':');
      if (at < 1) throw new StasisError('INVALID_ARGUMENT', `--label: ${JSON.stringify(pair)} must be key:value`);
      return [pair.slice(0, at), pair.slice(at + 1)];
    }),
  );
}

interface CreateOptions {
  label: string[];
  provider: string;
  template?: string;
  env: string[];
  workspace?: string;
  timeout?: string;
  ttl?: string;
}

interface ListOptions {
  state?: string;
  label: string[];
  pageSize?: number;
  pageToken?: string;
}

export function sandboxCommands(program: Command, begin: (cmd: Command) => CliContext): void {
  const sandbox = program.command('sandbox').description('standalone sandboxes');

  sandbox
    .command('create')
    .description('create a sandbox and start it')
    .option('--provider <name>', 'sandbox provider', 'local')
    .option('--template <template>', 'provider template')
    .option('--env <NAME=value>', 'environment variable (repeatable)', collect, [])
    .option('--workspace <hostPath>', 'an active workspace on this host path (default: isolated)')
    .option('--timeout <duration>', 'pause after this long idle (30s, 5m, 2h, 1d)')
    .option('--ttl <duration>', 'destroy after this long')
    .option(
      '--label <key:value>',
      'a label, searchable in Temporal Web and by `sandbox list` (repeatable)',
      collect,
      [],
    )
    .action(async (opts: CreateOptions, cmd: Command) => {
      const ctx = begin(cmd);
      const client = await ctx.client();
      const input: CreateSandboxInput = {
        provider: opts.provider,
        ...(opts.template ? { template: opts.template } : {}),
        ...(opts.env.length > 0 ? { env: envPairs(opts.env) } : {}),
        ...(opts.workspace ? { workspace: { kind: 'active', hostPath: opts.workspace } } : {}),
        ...(opts.timeout || opts.ttl
          ? { policy: { ...(opts.timeout ? { timeout: opts.timeout } : {}), ...(opts.ttl ? { ttl: opts.ttl } : {}) } }
          : {}),
        ...(opts.label.length > 0 ? { labels: labelPairs(opts.label) } : {}),
      };
      const created = await client.sandboxes.create(input);
      const started = await withProgress(
        ctx,
        `starting sandbox ${created.sandboxId}`,
        client.sandboxes.start(created.sandboxId),
      );
      ctx.print(started, `Created ${sandboxText(started)}`);
    });

  sandbox
    .command('list')
    .description('sandboxes, newest first (all but destroyed unless --state says), one page at a time')
    .option('--state <state>', 'only sandboxes in this state')
    .option('--label <key:value>', 'only sandboxes with this label (repeatable: all must match)', collect, [])
    .option('--page-size <n>', `sandboxes per page (1-${MAX_PAGE_SIZE}, default 100)`, wholeNumber(1, MAX_PAGE_SIZE))
    .option('--page-token <token>', 'the next page: the token the previous page printed')
    .action(async (opts: ListOptions, cmd: Command) => {
      const ctx = begin(cmd);
      const page = await (
        await ctx.client()
      ).sandboxes.list(
        {
          ...(opts.state !== undefined ? { state: opts.state as SandboxState } : {}),
          ...(opts.label.length > 0 ? { label: opts.label } : {}),
          ...(opts.pageSize !== undefined ? { pageSize: opts.pageSize } : {}),
          ...(opts.pageToken !== undefined ? { nextPageToken: opts.pageToken } : {}),
        },
        { inputName: 'options' },
      );
      ctx.print(page, sandboxListText(page));
    });

  sandbox
    .command('get <sandboxId>')
    .description('a sandbox and its state')
    .action(async (sandboxId: string, _opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const view = await (await ctx.client()).sandboxes.get(sandboxId);
      ctx.print(view, sandboxText(view));
    });

  sandbox
    .command('exec <sandboxId> <command...>')
    .description("run a shell command in the sandbox; its output is printed and its exit code is the CLI's")
    .option('--timeout-ms <ms>', 'kill the command after this many milliseconds', wholeNumber(1))
    .option('--env <NAME=value>', 'environment variable (repeatable)', collect, [])
    .action(async (sandboxId: string, words: string[], opts: { timeoutMs?: number; env: string[] }, cmd: Command) => {
      const ctx = begin(cmd);
      const env = envPairs(opts.env);
      const result = await (
        await ctx.client()
      ).sandboxes.exec(sandboxId, {
        command: words.join(' '),
        ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
        ...(env ? { env } : {}),
      });
      // The command's exit code is the CLI's, with --json too: scripts test `$?` either way.
      ctx.exitCode = result.exitCode;
      if (ctx.json) return ctx.print(result, '');
      // The command's own output, raw: the user asked for it.
      ctx.io.stdout.write(result.stdout);
      ctx.io.stderr.write(result.stderr);
    });

  sandbox
    .command('suspend <sandboxId>')
    .description('release the compute and keep the workspace (snapshot when isolated)')
    .action(async (sandboxId: string, _opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const view = await withProgress(
        ctx,
        `suspending sandbox ${sandboxId}`,
        (await ctx.client()).sandboxes.suspend(sandboxId),
      );
      ctx.print(view, sandboxText(view));
    });

  sandbox
    .command('resume <sandboxId>')
    .description('thaw a paused sandbox or restore a suspended one')
    .action(async (sandboxId: string, _opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const client = await ctx.client();
      const before = await client.sandboxes.get(sandboxId);
      const checkpoint = before.state === 'suspended' ? before.record.checkpoint : undefined;
      const label = checkpoint
        ? `restoring sandbox ${sandboxId} (${bytes(checkpoint.bytes)} checkpoint)`
        : `resuming sandbox ${sandboxId}`;
      const view = await withProgress(ctx, label, client.sandboxes.resume(sandboxId));
      ctx.print(view, sandboxText(view));
    });

  sandbox
    .command('destroy <sandboxId>')
    .description('destroy the sandbox, its workspace and its checkpoint')
    .action(async (sandboxId: string, _opts: unknown, cmd: Command) => {
      const ctx = begin(cmd);
      const view = await withProgress(
        ctx,
        `destroying sandbox ${sandboxId}`,
        (await ctx.client()).sandboxes.destroy(sandboxId),
      );
      ctx.print(view, `Destroyed ${sandboxId}`);
    });
}
