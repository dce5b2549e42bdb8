import * as http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

// A small fault-injecting HTTP proxy on loopback in front of an S3 store
// (MinIO): it passes requests through, answers 503 SlowDown, delays each
// request, or stalls (accepts and never answers); `hold` cuts chosen requests
// part-way through their body (a worker killed while a PutObject is on the wire),
// `corrupt` flips a byte of chosen requests' bodies, `chunked` answers chosen
// requests without a Content-Length, `early` answers 503 SlowDown to chosen
// requests as soon as their headers arrive, reading none of the body (S3 does
// this to a PutObject that asked `Expect: 100-continue`; to one that did not it
// answers and closes the connection).
// The Host header is passed through unchanged, so SigV4 signatures made for the
// proxy's address verify.

export type ProxyMode = { kind: 'pass' } | { kind: '503' } | { kind: 'delay'; ms: number } | { kind: 'stall' };

export interface ProxiedRequest {
  at: number;
  method: string;
  path: string;
  /** What the proxy did with it. */
  outcome:
    'passed' | '503' | 'early 503' | 'delayed' | 'stalled' | 'held' | 'corrupted' | 'answered' | 'upstream error';
  /** Whether the client asked `Expect: 100-continue` (sends the body only after a 100 Continue). */
  expectContinue: boolean;
}

/**
 * A request whose body goes upstream only up to `afterBytes`; then `onHeld` is called once, and the
 * request hangs (or, with `reset`, both its connections are cut: the client sees a failed request).
 */
export interface BodyHold {
  afterBytes: number;
  onHeld: () => void;
  reset?: boolean;
}

export interface FaultProxy {
  /** http://127.0.0.1:<port>, to use as STASIS_S3_ENDPOINT. */
  url: string;
  mode: ProxyMode;
  /** Chooses the requests to cut part-way (whatever the mode). */
  hold?: (request: { method: string; path: string; contentLength: number }) => BodyHold | undefined;
  /** Chooses the requests whose body reaches the store with its first byte flipped (damaged on the wire). */
  corrupt?: (request: { method: string; path: string }) => boolean;
  /** Chooses the requests whose answer comes without a Content-Length (chunked transfer, as a gateway may send it). */
  chunked?: (request: { method: string; path: string }) => boolean;
  /** Chooses the requests answered 503 SlowDown before any of their body is read (`'early 503'`). */
  early?: (request: { method: string; path: string }) => boolean;
  /** A 200 answer with this XML body, made here: the request never reaches the store (`'answered'`). */
  answer?: (request: { method: string; path: string }) => string | undefined;
  requests: ProxiedRequest[];
  close(): Promise<void>;
}

const SLOW_DOWN =
  '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>injected by the fault proxy</Message></Error>';

export async function startS3Proxy(target: string): Promise<FaultProxy> {
  const upstream = new URL(target);
  const sockets = new Set<Socket>();
  const proxy: FaultProxy = { url: '', mode: { kind: 'pass' }, requests: [], close: async () => undefined };

  const forward = (req: http.IncomingMessage, res: http.ServerResponse, record: ProxiedRequest) => {
    const out = http.request(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        if (proxy.chunked?.({ method: record.method, path: record.path })) delete answer.headers['content-length'];
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    out.on('error', () => {
      record.outcome = 'upstream error';
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    if (proxy.corrupt?.({ method: record.method, path: record.path })) {
      record.outcome = 'corrupted';
      let first = true;
      req.on('data', (chunk: Buffer) => {
        if (first && chunk.length > 0) {
          first = false;
          chunk = Buffer.from(chunk);
          chunk[0] ^= 0xff;
        }
        out.write(chunk);
      });
      req.on('end', () => out.end());
      return;
    }
    req.pipe(out);
  };

  /** Sends upstream the head of the body and no more: the store has a request in flight that never completes. */
  const forwardHead = (req: http.IncomingMessage, hold: BodyHold) => {
    const out = http.request({
      host: upstream.hostname,
      port: upstream.port,
      method: req.method,
      path: req.url,
      headers: req.headers,
    });
    out.on('error', () => undefined);
    let sent = 0;
    req.on('data', (chunk: Buffer) => {
      if (sent >= hold.afterBytes) return;
      const room = hold.afterBytes - sent;
      sent += chunk.length;
      if (sent < hold.afterBytes) {
        out.write(chunk);
        return;
      }
      req.pause();
      out.write(chunk.subarray(0, room), () => {
        hold.onHeld();
        if (!hold.reset) return;
        req.socket.destroy();
        out.destroy();
      });
    });
  };

  const handle = (req: http.IncomingMessage, res: http.ServerResponse, expectContinue: boolean) => {
    const mode = proxy.mode;
    const record: ProxiedRequest = {
      at: Date.now(),
      method: req.method ?? '',
      path: req.url ?? '',
      outcome: 'passed',
      expectContinue,
    };
    proxy.requests.push(record);
    if (proxy.early?.({ method: record.method, path: record.path })) {
      record.outcome = 'early 503';
      // No 100 Continue and no read of the body: a client that sent it anyway sees the connection close.
      res.writeHead(503, {
        'content-type': 'application/xml',
        'content-length': Buffer.byteLength(SLOW_DOWN),
        connection: 'close',
      });
      res.end(SLOW_DOWN, () => req.socket.destroySoon());
      return;
    }
    // The body is wanted: the client that asked may send it now.
    if (expectContinue) res.writeContinue();
    const hold = proxy.hold?.({
      method: record.method,
      path: record.path,
      contentLength: Number(req.headers['content-length'] ?? 0),
    });
    const answer = proxy.answer?.({ method: record.method, path: record.path });
    if (hold) {
      record.outcome = 'held';
      forwardHead(req, hold);
    } else if (answer !== undefined) {
      record.outcome = 'answered';
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/xml', 'content-length': Buffer.byteLength(answer) });
        res.end(answer);
      });
    } else if (mode.kind === '503') {
      record.outcome = '503';
      req.resume();
      req.on('end', () => {
        res.writeHead(503, { 'content-type': 'application/xml', 'content-length': Buffer.byteLength(SLOW_DOWN) });
        res.end(SLOW_DOWN);
      });
    } else if (mode.kind === 'stall') {
      record.outcome = 'stalled';
      req.resume();
    } else if (mode.kind === 'delay') {
      record.outcome = 'delayed';
      req.pause();
      setTimeout(() => forward(req, res, record), mode.ms);
    } else {
      forward(req, res, record);
    }
  };
  const server = http.createServer((req, res) => handle(req, res, false));
  // With a listener here, Node leaves the 100 Continue to us instead of sending it by itself.
  server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) => handle(req, res, true));
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  proxy.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  proxy.close = async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return proxy;
}
