import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import * as path from 'node:path';

// A throw-away CA and the certificates the cluster test needs, made with the
// openssl CLI: the frontend's server certificate (localhost, 127.0.0.1, ::1),
// a client certificate for Stasis processes and the server's system worker, and
// a certificate from another CA that the frontend must refuse.

export interface Certs {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  strangerCert: string;
  strangerKey: string;
}

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

function makeCa(dir: string, name: string): { cert: string; key: string } {
  const cert = path.join(dir, `${name}.pem`);
  const key = path.join(dir, `${name}.key`);
  openssl([
    'req',
    '-x509',
    ...EC,
    '-keyout',
    key,
    '-out',
    cert,
    '-days',
    '2',
    '-subj',
    `/CN=${name}`,
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  ]);
  return { cert, key };
}

function issue(
  dir: string,
  ca: { cert: string; key: string },
  name: string,
  extensions: string,
): { cert: string; key: string } {
  const cert = path.join(dir, `${name}.pem`);
  const key = path.join(dir, `${name}.key`);
  const csr = path.join(dir, `${name}.csr`);
  const ext = path.join(dir, `${name}.ext`);
  writeFileSync(ext, extensions);
  openssl(['req', ...EC, '-keyout', key, '-out', csr, '-subj', `/CN=${name}`]);
  openssl([
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    ca.cert,
    '-CAkey',
    ca.key,
    '-CAcreateserial',
    '-out',
    cert,
    '-days',
    '2',
    '-extfile',
    ext,
  ]);
  return { cert, key };
}

export function makeCerts(dir: string): Certs {
  const ca = makeCa(dir, 'stasis-test-ca');
  const server = issue(
    dir,
    ca,
    'temporal-frontend',
    'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\nextendedKeyUsage=serverAuth,clientAuth\n',
  );
  const client = issue(dir, ca, 'stasis-client', 'extendedKeyUsage=clientAuth\n');
  const stranger = issue(dir, makeCa(dir, 'another-ca'), 'stranger', 'extendedKeyUsage=clientAuth\n');
  return {
    ca: ca.cert,
    serverCert: server.cert,
    serverKey: server.key,
    clientCert: client.cert,
    clientKey: client.key,
    strangerCert: stranger.cert,
    strangerKey: stranger.key,
  };
}
