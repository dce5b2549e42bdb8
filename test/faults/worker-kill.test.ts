import { workerKillTrials } from './worker-kill-trials';

// Area worker-kill: the worker SIGKILLed mid-release and mid-restore, `local` sandboxes.
workerKillTrials('local', 'worker-kill');
