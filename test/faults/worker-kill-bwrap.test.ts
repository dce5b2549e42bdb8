import { workerKillTrials } from './worker-kill-trials';

// Area worker-kill-bwrap: the same trials with `bwrap` sandboxes, which must outlive their worker.
workerKillTrials('bwrap', 'worker-kill-bwrap');
