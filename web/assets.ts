import { existsSync, readFileSync } from 'node:fs';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';

// The approval page: plain HTML, CSS and one vanilla script, read once at start
// and served as they are (no build step). No secrets or resource state in them;
// the script signs in with a token and talks to /api like any client.

const FILES = [
  { url: '/', file: 'index.html', type: 'text/html; charset=utf-8' },
  { url: '/app.js', file: 'app.js', type: 'text/javascript; charset=utf-8' },
  { url: '/markdown.js', file: 'markdown.js', type: 'text/javascript; charset=utf-8' },
  { url: '/style.css', file: 'style.css', type: 'text/css; charset=utf-8' },
] as const;

const HEADERS = {
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
  // A `?token=` sign-in link must not leak through the Referer header.
  'referrer-policy': 'no-referrer',
  // Cache-Control: no-store and X-Content-Type-Options: nosniff come with every answer of the server (api/server.ts).
};

/** Beside this module when run from source; from dist/web, the source tree's web/. */
function webDir(): string {
  const candidates = [__dirname, path.resolve(__dirname, '..', '..', 'web')];
  const found = candidates.find((dir) => existsSync(path.join(dir, 'index.html')));
  if (!found) throw new Error(`approval page files not found in ${candidates.join(' or ')}`);
  return found;
}

export function registerWebPage(app: FastifyInstance): void {
  const dir = webDir();
  for (const { url, file, type } of FILES) {
    const body = readFileSync(path.join(dir, file));
    app.get(url, { config: { public: true } }, async (_request, reply) => reply.headers(HEADERS).type(type).send(body));
  }
}
