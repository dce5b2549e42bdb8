import { serveSpawner } from './spawner';

// Entry of the process-starting helper the worker forks (see spawner.ts).
serveSpawner();
