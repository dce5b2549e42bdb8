import { mkdtempSync } from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { Connection } from '@temporalio/client';
import { NativeConnection } from '@temporalio/worker';
import { StasisClient } from '../../client';
import { loadConfig } from '../../common/config';
import { DEFAULT_TEMPORAL_ADDRESS, temporalConnectConfig } from '../../common/temporal-connection';
import { configProblems, pemFiles } from '../helpers/config';

// The Temporal connection comes from @temporalio/envconfig: the temporal.toml
// profile, then TEMPORAL_* variables over it; IPv6 addresses work end to end.

const dir = mkdtempSync(path.join(process.env.STASIS_TEST_DATA_DIR ?? os.tmpdir(), 'envconfig-'));
const { file, ca, crt, key, read } = pemFiles(dir);
const toml = file(
  'temporal.toml',
  `[profile.default]
address = "default-host:7233"

[profile.cloud]
address = "stasis.a1b2c.tmprl.cloud:7233"
namespace = "stasis.a1b2c"
api_key = "secret-from-profile"

[profile.mtls]
address = "temporal.internal:7233"
namespace = "prod"
[profile.mtls.tls]
client_cert_path = "${crt}"
client_key_path = "${key}"
server_ca_cert_path = "${ca}"
server_name = "temporal.internal"
`,
);

// Only the variables given: the machine's own temporal.toml must not leak in.
const isolated = (vars: Record<string, string>) => ({ HOME: dir, ...vars });

test('nothing configured: the default address, not marked as configured, and the default namespace', () => {
  const config = temporalConnectConfig(isolated({}));
  expect(config).toEqual({
    connectionOptions: { address: DEFAULT_TEMPORAL_ADDRESS },
    namespace: 'default',
    addressConfigured: false,
  });
  expect(loadConfig(isolated({ TEMPORAL_ADDRESS: '' })).TEMPORAL_ADDRESS).toBeUndefined();
});

test('a temporal.toml profile named by TEMPORAL_PROFILE gives the address, namespace and API key (TLS on)', () => {
  const config = loadConfig(isolated({ TEMPORAL_CONFIG_FILE: toml, TEMPORAL_PROFILE: 'cloud' }));
  expect(config.TEMPORAL_ADDRESS).toBe('stasis.a1b2c.tmprl.cloud:7233');
  expect(config.TEMPORAL_NAMESPACE).toBe('stasis.a1b2c');
  expect(config.temporal.connectionOptions).toEqual({
    address: 'stasis.a1b2c.tmprl.cloud:7233',
    apiKey: 'secret-from-profile',
    tls: true,
  });
});

test('mTLS files of a profile are read; TEMPORAL_* variables override the profile field by field', () => {
  const config = loadConfig(
    isolated({
      TEMPORAL_CONFIG_FILE: toml,
      TEMPORAL_PROFILE: 'mtls',
      TEMPORAL_NAMESPACE: 'staging',
      TEMPORAL_TLS_SERVER_NAME: 'other.internal',
    }),
  );
  expect(config.TEMPORAL_NAMESPACE).toBe('staging');
  const { tls, address } = config.temporal.connectionOptions;
  expect(address).toBe('temporal.internal:7233');
  expect(tls).toMatchObject({ serverNameOverride: 'other.internal' });
  if (typeof tls !== 'object') throw new Error('expected a TLS config');
  expect(Buffer.from(tls.serverRootCACertificate ?? []).toString()).toBe(read(ca));
  expect(Buffer.from(tls.clientCertPair?.crt ?? []).toString()).toBe(read(crt));
  expect(Buffer.from(tls.clientCertPair?.key ?? []).toString()).toBe(read(key));
});

test('the default profile applies without TEMPORAL_PROFILE; TEMPORAL_ADDRESS wins over it', () => {
  expect(loadConfig(isolated({ TEMPORAL_CONFIG_FILE: toml })).TEMPORAL_ADDRESS).toBe('default-host:7233');
  expect(loadConfig(isolated({ TEMPORAL_CONFIG_FILE: toml, TEMPORAL_ADDRESS: '[::1]:7233' })).TEMPORAL_ADDRESS).toBe(
    '[::1]:7233',
  );
});

test.each([
  [{ TEMPORAL_PROFILE: 'nope' }, /^TEMPORAL_PROFILE: .*nope/],
  [
    { TEMPORAL_TLS_CLIENT_CERT_PATH: path.join(dir, 'missing.pem'), TEMPORAL_TLS_CLIENT_KEY_PATH: key },
    /^TEMPORAL_TLS_CLIENT_CERT_PATH: .*missing\.pem/,
  ],
  [{ TEMPORAL_ADDRESS: '::1:7233' }, /^TEMPORAL_ADDRESS: must be host:port/],
])('a bad connection setting is one line naming it: %j', (vars, line) => {
  expect(configProblems(isolated({ TEMPORAL_CONFIG_FILE: toml, ...vars }))).toEqual([expect.stringMatching(line)]);
});

describe('an IPv6 address', () => {
  // The test server listens on 127.0.0.1; a TCP relay on [::1] puts it behind an IPv6 address.
  let relay: net.Server;
  let address: string;
  beforeAll(async () => {
    const [host, port] = (process.env.TEMPORAL_ADDRESS ?? '').split(':');
    relay = net.createServer((inbound) => {
      const outbound = net.connect(Number(port), host);
      inbound.pipe(outbound).pipe(inbound);
      inbound.on('error', () => outbound.destroy());
      outbound.on('error', () => inbound.destroy());
    });
    await new Promise<void>((resolve) => relay.listen(0, '::1', resolve));
    address = `[::1]:${(relay.address() as net.AddressInfo).port}`;
  });
  afterAll(async () => {
    await new Promise((resolve) => relay.close(resolve));
  });

  test('reaches Temporal from the client, the worker connection and the Stasis client', async () => {
    const config = loadConfig({ ...process.env, TEMPORAL_ADDRESS: address });
    expect(config.temporal.connectionOptions.address).toBe(address);
    const namespace = config.TEMPORAL_NAMESPACE;

    const connection = await Connection.connect(config.temporal.connectionOptions);
    const described = await connection.workflowService.describeNamespace({ namespace });
    expect(described.namespaceInfo?.name).toBe(namespace);
    await connection.close();

    const native = await NativeConnection.connect(config.temporal.connectionOptions);
    await native.close();

    const client = await StasisClient.connect({ connection: config.temporal.connectionOptions, namespace });
    await expect(client.runs.list()).resolves.toBeDefined();
    await client.close();
  });

  test('a namespace the environment gives that the server does not have is INVALID_ARGUMENT naming TEMPORAL_NAMESPACE (given as an option, it is named `namespace`: unit/client-input)', async () => {
    const saved = { address: process.env.TEMPORAL_ADDRESS, namespace: process.env.TEMPORAL_NAMESPACE };
    process.env.TEMPORAL_ADDRESS = address;
    process.env.TEMPORAL_NAMESPACE = 'no-such-namespace-either';
    try {
      await expect(StasisClient.connect()).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/^TEMPORAL_NAMESPACE: "no-such-namespace-either" does not exist on /),
      });
    } finally {
      for (const [key, value] of [
        ['TEMPORAL_ADDRESS', saved.address],
        ['TEMPORAL_NAMESPACE', saved.namespace],
      ] as const) {
        if (value === undefined) delete process.env[key];
        else process.env[key] = value;
      }
    }
  });
});
