import type { AgentDriver, AgentStepInput, AgentStepOutput } from 'stasis/drivers';

// The consumer's own agent: writes its input to a file, runs one command that reads it
// back, and completes with what the command printed.

interface EchoState {
  phase: 'written' | 'ran';
}

export const echoDriver: AgentDriver = {
  name: 'consumer-echo',
  async step({ agent, state, lastResult }: AgentStepInput): Promise<AgentStepOutput> {
    const { input } = agent as { input: string };
    const current = state as EchoState | undefined;
    if (current === undefined) {
      return { action: { type: 'writeFile', path: 'note.txt', content: input }, state: { phase: 'written' } };
    }
    if (current.phase === 'written') {
      return {
        action: {
          type: 'job',
          command: 'cat note.txt; printf " (run by %s)" "$CONSUMER_PROVIDER"',
          pauseBehavior: 'CANCEL',
          executionAffinity: 'SANDBOX',
          background: false,
        },
        state: { phase: 'ran' },
      };
    }
    const { stdout } = lastResult as { stdout: string };
    return { action: { type: 'complete', output: { said: stdout } }, state };
  },
};
