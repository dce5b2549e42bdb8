import { closeInheritedDescriptors } from './inherited-fds';
import { serveSpawner } from './spawner';

// Entry of the process-starting helper the worker forks (see spawner.ts). Descriptors the worker
// inherited from whoever started it would pass on to every sandbox process: closed first.
closeInheritedDescriptors();
serveSpawner();
