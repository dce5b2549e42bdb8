import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';

// A host's own Prometheus endpoint (GET /metrics) for the registry of its
// WorkerMetrics, on STASIS_METRICS_ADDR; the SDK's worker metrics are served
// separately by the SDK on STASIS_WORKER_METRICS_ADDR.

export interface MetricsServer {
  url: string;
  close(): Promise<void>;
}

/** Serves `registry` on host:port; rejects when the address cannot be bound. */
export async function serveMetrics(registry: Registry, addr: string): Promise<MetricsServer> {
  const at = addr.lastIndexOf(':');
  const host = addr.slice(0, at).replace(/^\[(.*)\]$/, '$1');
  const port = Number(addr.slice(at + 1));
  const server: Server = createServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (err: unknown) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(err)}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const bound = server.address();
  const shown = typeof bound === 'object' && bound ? `${addr.slice(0, at)}:${bound.port}` : addr;
  return {
    url: `http://${shown}/metrics`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
