import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import fc from 'fast-check';
import { loadConfig } from '../../common/config';
import { configProblems, pemFiles } from '../helpers/config';

// The Temporal connection's configuration (temporal.toml, TEMPORAL_*) as loadConfig reports it:
// every mistake is one line naming the variable or file, never quoting a secret, and TLS asked
// for is never silently off. No server is needed.

const dir = mkdtempSync(path.join(os.tmpdir(), 'temporal-connection-'));
const { file, ca, crt, key, strayKey, read } = pemFiles(dir);
// Only the variables given: the machine's own temporal.toml must not leak in (HOME has none).
const isolated = (vars: Record<string, string>) => ({ HOME: dir, ...vars });
const ADDRESS = { TEMPORAL_ADDRESS: 'temporal.internal:7233' };

describe('a malformed temporal.toml', () => {
  const secret = 'tmprl-SUPERSECRET-api-key-0123456789';
  test.each([
    ['a bad value after the api_key', `[profile.default]\naddress = "x:7233"\napi_key = "${secret}" oops\n`],
    ['a bad line after the api_key', `[profile.default]\napi_key = "${secret}" # rotated\nextra = oops\n`],
    ['inline key data', `[profile.default.tls]\nclient_key_data = "-----BEGIN PRIVATE KEY-----\\n${secret}" ,\n`],
  ])('%s: one line naming TEMPORAL_CONFIG_FILE and the position, not the contents', (_, content) => {
    const toml = file('bad.toml', content);
    const lines = configProblems(isolated({ TEMPORAL_CONFIG_FILE: toml }));
    expect(lines).toEqual([
      expect.stringMatching(/^TEMPORAL_CONFIG_FILE: .*bad\.toml: not valid TOML \(line \d+, column \d+\)$/),
    ]);
    expect(lines.join('\n')).not.toContain(secret);
  });

  test('the default temporal.toml is named by its path', () => {
    const home = mkdtempSync(path.join(dir, 'home-'));
    mkdirSync(path.join(home, '.config', 'temporalio'), { recursive: true });
    writeFileSync(
      path.join(home, '.config', 'temporalio', 'temporal.toml'),
      `[profile.default\napi_key = "${secret}"\n`,
    );
    const lines = configProblems({ HOME: home });
    expect(lines).toEqual([expect.stringMatching(/temporalio\/temporal\.toml: not valid TOML \(line \d+/)]);
    expect(lines.join('\n')).not.toContain(secret);
  });

  // envconfig itself threw "Cannot read properties of undefined (reading 'default')" on these.
  test.each([
    ['empty', ''],
    ['comments only', '# no profiles yet\n'],
    ['another table only', '[other]\nx = 1\n'],
  ])('a temporal.toml with no profile table (%s) is the environment alone, or names the missing profile', (_, text) => {
    const toml = file('no-profile.toml', text);
    const config = loadConfig(
      isolated({ TEMPORAL_CONFIG_FILE: toml, TEMPORAL_ADDRESS: 'h:7233', TEMPORAL_NAMESPACE: 'n' }),
    );
    expect(config.temporal.connectionOptions.address).toBe('h:7233');
    expect(config.TEMPORAL_NAMESPACE).toBe('n');
    expect(configProblems(isolated({ TEMPORAL_CONFIG_FILE: toml, TEMPORAL_PROFILE: 'prod' }))).toEqual([
      "TEMPORAL_PROFILE: Profile 'prod' not found in config data",
    ]);
  });
});

describe('TEMPORAL_TLS', () => {
  test('true/false/1/0 in any case turn TLS on or off; anything else is an error naming TEMPORAL_TLS', () => {
    fc.assert(
      fc.property(
        fc.oneof(fc.constantFrom('true', 'TRUE', 'True', '1', 'false', 'FALSE', 'False', '0'), fc.string()),
        (value) => {
          const vars = { ...ADDRESS, TEMPORAL_TLS: value, TEMPORAL_API_KEY: 'k-0123456789abcdef' };
          const normal = value.toLowerCase();
          if (value === '') return; // unset
          if (['true', '1'].includes(normal))
            expect(loadConfig(isolated(vars)).temporal.connectionOptions.tls).toEqual({});
          else if (['false', '0'].includes(normal))
            expect(loadConfig(isolated(vars)).temporal.connectionOptions.tls).toBe(false);
          else expect(configProblems(isolated(vars))).toEqual([expect.stringMatching(/^TEMPORAL_TLS: must be true/)]);
        },
      ),
    );
  });

  test.each([
    ['a server CA', { TEMPORAL_TLS_SERVER_CA_CERT_PATH: ca }, /TEMPORAL_TLS_SERVER_CA_CERT_PATH/],
    [
      'a client certificate and key',
      { TEMPORAL_TLS_CLIENT_CERT_PATH: crt, TEMPORAL_TLS_CLIENT_KEY_PATH: key },
      /TEMPORAL_TLS_CLIENT_CERT_PATH/,
    ],
    [
      'client key data',
      { TEMPORAL_TLS_CLIENT_CERT_PATH: crt, TEMPORAL_TLS_CLIENT_KEY_DATA: 'key' },
      /TEMPORAL_TLS_CLIENT_KEY_DATA/,
    ],
  ])('TEMPORAL_TLS=false next to %s is a conflict naming both', (_, vars, material) => {
    for (const off of ['false', '0'])
      expect(configProblems(isolated({ ...ADDRESS, TEMPORAL_TLS: off, ...vars }))).toEqual([
        expect.stringMatching(new RegExp(`^TEMPORAL_TLS: TLS is off, but .*${material.source}`)),
      ]);
  });

  test("a profile's tls.disabled next to its TLS material is a conflict naming the file", () => {
    const toml = file('disabled.toml', `[profile.default.tls]\ndisabled = true\nserver_ca_cert_path = "${ca}"\n`);
    expect(configProblems(isolated({ TEMPORAL_CONFIG_FILE: toml }))).toEqual([
      expect.stringMatching(/^tls\.disabled of .*disabled\.toml: TLS is off, but tls\.server_ca_cert/),
    ]);
  });
});

describe('mTLS material', () => {
  test.each([
    [{ TEMPORAL_TLS_CLIENT_CERT_PATH: crt }, 'TEMPORAL_TLS_CLIENT_KEY_PATH'],
    [{ TEMPORAL_TLS_CLIENT_CERT_DATA: 'cert' }, 'TEMPORAL_TLS_CLIENT_KEY_PATH'],
    [{ TEMPORAL_TLS_CLIENT_KEY_PATH: key }, 'TEMPORAL_TLS_CLIENT_CERT_PATH'],
    [{ TEMPORAL_TLS_CLIENT_KEY_DATA: 'key' }, 'TEMPORAL_TLS_CLIENT_CERT_PATH'],
  ])('%j without its pair is an error naming the missing %s', (vars, missing) => {
    expect(configProblems(isolated({ ...ADDRESS, ...vars }))).toEqual([
      expect.stringMatching(new RegExp(`^${missing} \\(or .*_DATA\\): must be set with`)),
    ]);
  });

  test.each([
    ['TEMPORAL_TLS_SERVER_CA_CERT_PATH', {}],
    ['TEMPORAL_TLS_CLIENT_CERT_PATH', { TEMPORAL_TLS_CLIENT_KEY_PATH: key }],
    ['TEMPORAL_TLS_CLIENT_KEY_PATH', { TEMPORAL_TLS_CLIENT_CERT_PATH: crt }],
  ])('a missing file of %s is an error naming that variable and the path', (variable, others) => {
    const missing = path.join(dir, 'missing.pem');
    expect(configProblems(isolated({ ...ADDRESS, ...others, [variable]: missing }))).toEqual([
      `${variable}: cannot read ${missing} (ENOENT)`,
    ]);
    // Present, all three are read into the connection options.
    const { tls } = loadConfig(
      isolated({
        ...ADDRESS,
        TEMPORAL_TLS_SERVER_CA_CERT_PATH: ca,
        TEMPORAL_TLS_CLIENT_CERT_PATH: crt,
        TEMPORAL_TLS_CLIENT_KEY_PATH: key,
      }),
    ).temporal.connectionOptions;
    if (typeof tls !== 'object') throw new Error('expected a TLS config');
    expect(Buffer.from(tls.serverRootCACertificate ?? []).toString()).toBe(read(ca));
    expect(Buffer.from(tls.clientCertPair?.crt ?? []).toString()).toBe(read(crt));
    expect(Buffer.from(tls.clientCertPair?.key ?? []).toString()).toBe(read(key));
  });

  // Each was an INTERNAL or UNAVAILABLE error at the first call (the TLS handshake), not a configuration error.
  const notPem = file('not-pem.txt', 'SECRET-LOOKING-CONTENT\n');
  const encrypted = path.join(dir, 'encrypted.key');
  execFileSync('openssl', ['pkey', '-in', key, '-aes256', '-passout', 'pass:pw', '-out', encrypted]);
  const pair = { TEMPORAL_TLS_CLIENT_CERT_PATH: crt, TEMPORAL_TLS_CLIENT_KEY_PATH: key };
  test.each([
    ['TEMPORAL_TLS_SERVER_CA_CERT_PATH', notPem, {}, 'not a PEM certificate'],
    ['TEMPORAL_TLS_SERVER_CA_CERT_PATH', key, {}, 'not a PEM certificate'],
    ['TEMPORAL_TLS_CLIENT_CERT_PATH', notPem, pair, 'not a PEM certificate'],
    ['TEMPORAL_TLS_CLIENT_CERT_PATH', key, pair, 'not a PEM certificate'],
    ['TEMPORAL_TLS_CLIENT_KEY_PATH', notPem, pair, 'not an unencrypted PEM private key'],
    ['TEMPORAL_TLS_CLIENT_KEY_PATH', crt, pair, 'not an unencrypted PEM private key'],
    ['TEMPORAL_TLS_CLIENT_KEY_PATH', encrypted, pair, 'not an unencrypted PEM private key'],
    ['TEMPORAL_TLS_CLIENT_KEY_PATH', strayKey, pair, 'not the key of the certificate in TEMPORAL_TLS_CLIENT_CERT_PATH'],
  ])('%s naming %s is an error naming the variable, quoting nothing of it', (variable, given, others, problem) => {
    const problems = configProblems(isolated({ ...ADDRESS, ...others, [variable]: given }));
    expect(problems).toEqual([expect.stringMatching(new RegExp(`^${variable}: ${problem}`))]);
    expect(problems.join()).not.toContain('SECRET-LOOKING');
    expect(problems.join()).not.toContain('MII');
  });

  test('material given inline (_DATA) is checked the same way', () => {
    expect(
      configProblems(
        isolated({
          ...ADDRESS,
          TEMPORAL_TLS_CLIENT_CERT_DATA: read(crt),
          TEMPORAL_TLS_CLIENT_KEY_DATA: read(strayKey),
        }),
      ),
    ).toEqual(['TEMPORAL_TLS_CLIENT_KEY_DATA: not the key of the certificate in TEMPORAL_TLS_CLIENT_CERT_DATA']);
    expect(
      configProblems(
        isolated({ ...ADDRESS, TEMPORAL_TLS_CLIENT_CERT_DATA: read(crt), TEMPORAL_TLS_CLIENT_KEY_DATA: read(key) }),
      ),
    ).toEqual([]);
  });
});

describe('TEMPORAL_PROFILE', () => {
  const FIELDS = ['address', 'namespace', 'api_key', 'tls', 'codec', 'grpc_meta', 'apiKey', 'grpcMeta'];
  const untouched = () => {
    const polluted = FIELDS.filter((f) => Object.prototype.hasOwnProperty.call(Object.prototype, f));
    const fn = FIELDS.filter((f) => Object.prototype.hasOwnProperty.call(Function.prototype, f));
    for (const f of FIELDS) {
      delete (Object.prototype as Record<string, unknown>)[f];
      delete (Function.prototype as unknown as Record<string, unknown>)[f];
    }
    expect([...polluted, ...fn]).toEqual([]);
  };

  test.each(['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf'])(
    'TEMPORAL_PROFILE=%s is refused before the lookup: nothing is written onto Object.prototype',
    (name) => {
      const lines = configProblems(isolated({ ...ADDRESS, TEMPORAL_PROFILE: name }));
      untouched();
      expect(lines).toEqual([expect.stringMatching(/^TEMPORAL_PROFILE: must be a profile name/)]);
    },
  );

  test('any profile name but the one temporal.toml has is an error naming TEMPORAL_PROFILE and writes nothing shared', () => {
    const toml = file('profiles.toml', '[profile.prod]\naddress = "prod:7233"\n');
    expect(loadConfig(isolated({ TEMPORAL_CONFIG_FILE: toml, TEMPORAL_PROFILE: 'prod' })).TEMPORAL_ADDRESS).toBe(
      'prod:7233',
    );
    fc.assert(
      fc.property(
        fc.oneof(fc.string({ minLength: 1 }), fc.constantFrom(...Object.getOwnPropertyNames(Object.prototype))),
        fc.boolean(),
        (name, withFile) => {
          fc.pre(name !== 'prod');
          const lines = configProblems(
            isolated({ ...ADDRESS, TEMPORAL_PROFILE: name, ...(withFile ? { TEMPORAL_CONFIG_FILE: toml } : {}) }),
          );
          untouched();
          expect(lines).toEqual([expect.stringMatching(/^TEMPORAL_PROFILE: /)]);
        },
      ),
    );
  });
});

describe('TEMPORAL_CONFIG_FILE', () => {
  test('a file that does not exist is an error naming TEMPORAL_CONFIG_FILE and the path', () => {
    const missing = path.join(dir, 'no-such-temporal.toml');
    expect(configProblems(isolated({ TEMPORAL_CONFIG_FILE: missing }))).toEqual([
      `TEMPORAL_CONFIG_FILE: ${missing}: cannot read (ENOENT)`,
    ]);
  });

  test('a directory is an error naming TEMPORAL_CONFIG_FILE and the path', () => {
    const d = path.join(dir, 'a-dir.toml');
    mkdirSync(d, { recursive: true });
    expect(configProblems(isolated({ TEMPORAL_CONFIG_FILE: d }))).toEqual([`TEMPORAL_CONFIG_FILE: ${d}: not a file`]);
  });
});

describe('the Temporal address and namespace', () => {
  test('TEMPORAL_ADDRESS with a port outside 1 to 65535 is an error naming it', () => {
    fc.assert(
      fc.property(fc.constantFrom('temporal.internal', '[::1]'), fc.integer({ min: 0, max: 99999 }), (host, port) => {
        const address = `${host}:${port}`;
        if (port >= 1 && port <= 65535)
          expect(loadConfig(isolated({ TEMPORAL_ADDRESS: address })).TEMPORAL_ADDRESS).toBe(address);
        else
          expect(configProblems(isolated({ TEMPORAL_ADDRESS: address }))).toEqual([
            expect.stringMatching(/^TEMPORAL_ADDRESS: the port must be from 1 to 65535/),
          ]);
      }),
      {
        examples: [
          ['temporal.internal', 0],
          ['temporal.internal', 65535],
          ['[::1]', 65536],
        ],
      },
    );
  });

  test.each([
    ['address = "not an address"', /^the temporal\.toml profile's address: must be host:port/],
    ['address = "h:70000"', /^the temporal\.toml profile's address: the port must be from 1 to 65535/],
    ['address = "h:7233"\nnamespace = ""', /^the temporal\.toml profile's namespace: /],
  ])("a profile's %s gets the environment's checks", (fields, line) => {
    const toml = file('profile-checks.toml', `[profile.default]\n${fields}\n`);
    expect(configProblems(isolated({ TEMPORAL_CONFIG_FILE: toml }))).toEqual([expect.stringMatching(line)]);
  });
});
