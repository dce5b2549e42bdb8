// The agent-driver API (`stasis/drivers`): a driver answers one action per step.

export { AgentAction, type AgentDriver, type AgentStepInput, type AgentStepOutput } from '../drivers/api';
export type { DriverModule } from '../workers/drivers';
