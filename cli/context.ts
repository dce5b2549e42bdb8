import type { Writable } from 'node:stream';
import { StasisClient } from '../client';
import { clientOptions } from '../client/options';
import { ConfigError, loadConfig, type Config } from '../common/config';
import { StasisError } from '../common/errors';

// What every command works with: the streams, the --json switch, the
// configuration (read once, on first use) and one typed client.

export interface CliIo {
  stdout: Writable & { isTTY?: boolean };
  stderr: Writable & { isTTY?: boolean };
  env: NodeJS.ProcessEnv;
}

export class CliContext {
  json = false;
  /** What the process exits with when the command succeeds (sandbox exec passes the command's on). */
  exitCode = 0;
  private loaded?: Config;
  private connecting?: Promise<StasisClient>;

  constructor(readonly io: CliIo) {}

  /** Throws ConfigError naming each bad variable (the CLI exits 2). */
  config(): Config {
    this.loaded ??= loadConfig(this.io.env);
    return this.loaded;
  }

  client(): Promise<StasisClient> {
    this.connecting ??= this.connect();
    return this.connecting;
  }

  private async connect(): Promise<StasisClient> {
    const options = clientOptions(this.config());
    try {
      return await StasisClient.connect(options);
    } catch (err) {
      if (err instanceof ConfigError) throw err; // reached, but the namespace is not there
      // The client names the address it could not reach; the CLI adds what to do about it.
      const unreachable =
        err instanceof StasisError
          ? err.message
          : `Temporal is not reachable at ${options.connection.address} (${err instanceof Error ? err.message : String(err)})`;
      throw new StasisError('UNAVAILABLE', `${unreachable}; start \`stasis dev\` or set TEMPORAL_ADDRESS`);
    }
  }

  /** Machine output with --json, the human text otherwise. */
  print(value: unknown, human: string): void {
    this.io.stdout.write(this.json ? `${JSON.stringify(value, null, 2)}\n` : `${human.replace(/\n?$/, '\n')}`);
  }

  /** Progress and notes go to stderr, so stdout stays parseable. */
  note(line: string): void {
    this.io.stderr.write(`${line}\n`);
  }

  async close(): Promise<void> {
    const client = await this.connecting?.catch(() => undefined);
    await client?.close();
  }
}
